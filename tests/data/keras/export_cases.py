"""Writes the small Keras models the Loop/Scan import tests read, exported through tf2onnx (opset 17), beside this file.

    python tests/data/keras/export_cases.py      # needs tensorflow-cpu and tf2onnx (pyproject's test extra)

The files are kept in the repository so that the tests need no TensorFlow. Seeded: reruns give the same weights.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES, UNITS = 5, 7


def _layers():
    import keras

    gru0 = dict(reset_after=False)
    return {  # name -> a function from the input to the output(s)
        "gru_reset_before_seq": lambda x: keras.layers.GRU(UNITS, return_sequences=True, **gru0)(x),
        "gru_reset_after_last": lambda x: keras.layers.GRU(UNITS)(x),
        "gru_reset_before_state": lambda x: keras.layers.GRU(UNITS, return_state=True, **gru0)(x)[1],
        # recurrent dropout (a no-op at inference) keeps tf2onnx from writing an ONNX LSTM: a Loop, gates one by one
        "lstm_loop_state": lambda x: keras.layers.LSTM(UNITS, recurrent_dropout=0.1, return_sequences=True,
                                                       return_state=True)(x),
        "simple_rnn_seq": lambda x: keras.layers.SimpleRNN(UNITS, return_sequences=True)(x),
        "bi_gru_lstm": lambda x: keras.layers.Bidirectional(keras.layers.LSTM(6))(
            keras.layers.Bidirectional(keras.layers.GRU(UNITS, return_sequences=True, **gru0))(x)),
        "gru_dense_seq": lambda x: keras.layers.Dense(3)(keras.layers.GRU(UNITS, return_sequences=True)(x)),
        "gru_backwards": lambda x: keras.layers.GRU(UNITS, go_backwards=True, return_sequences=True, **gru0)(x),
        "lstm_hard_sigmoid": lambda x: keras.layers.LSTM(UNITS, recurrent_activation="hard_sigmoid")(x),
    }


def export(name, build, out_dir=HERE):
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(sum(map(ord, name)))
    x = keras.Input((None, FEATURES), name="x")
    model = keras.Model(x, build(x))
    spec = (tf.TensorSpec((None, None, FEATURES), tf.float32, name="x"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    path = os.path.join(out_dir, f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return path, [n.op_type for n in proto.graph.node]


if __name__ == "__main__":
    for name, build in _layers().items():
        path, ops = export(name, build)
        print(f"{path}: {os.path.getsize(path)} bytes, {sorted(set(ops) & {'Loop', 'Scan', 'LSTM', 'GRU', 'RNN', 'ReverseSequence'})}")
