"""Whole models around recurrent layers, built with torch and exported as users export them (the TorchScript exporter).

Each builder returns (torch module, input shape, fold_bn); `build` exports it and returns (onnx.ModelProto, feeds):
random weights from a fixed seed, an input of the model's shape.
`python tests/graph_cases.py OUT_DIR` writes them all as ONNX files (for `tvmrnn bench --model`).
"""

from __future__ import annotations

import io
import os
import sys

import onnx


def _conv_bn_relu(torch, cin, cout, bn=True):
    nn = torch.nn
    return [nn.Conv2d(cin, cout, 3, 1, 1)] + ([nn.BatchNorm2d(cout)] if bn else []) + [nn.ReLU()]


def _randomize_bn(net, torch):
    """Non-trivial running statistics, so a BatchNorm that is dropped or misfolded shows in the outputs."""
    g = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def _crnn_class(torch):
    nn = torch.nn

    class CRNN(nn.Module):
        """conv stack -> [W, N, C*H] sequence -> BiLSTM x layers -> Linear -> log-softmax (CTC's)."""

        def __init__(self, convs, channels, hidden, classes, layers=2):
            super().__init__()
            self.cnn = nn.Sequential(*convs)
            self.rnn = nn.LSTM(channels, hidden, num_layers=layers, bidirectional=True)
            self.fc = nn.Linear(2 * hidden, classes)

        def forward(self, x):
            f = self.cnn(x)  # [N, C, H', W']
            n, c, h, w = f.shape
            seq = f.reshape(n, c * h, w).permute(2, 0, 1)  # [W', N, C*H']
            y, _ = self.rnn(seq)
            return self.fc(y).log_softmax(-1)

    return CRNN


def vgg_crnn(torch, fold_bn=True, height=32, width=100):
    """The CRNN OCR model (Shi et al.): a VGG of 7 convs (BatchNorm on three), pools to height 1, BiLSTM(256) x 2, 37 classes."""
    nn = torch.nn
    convs = (_conv_bn_relu(torch, 1, 64, False) + [nn.MaxPool2d(2, 2)] + _conv_bn_relu(torch, 64, 128, False)
             + [nn.MaxPool2d(2, 2)] + _conv_bn_relu(torch, 128, 256) + _conv_bn_relu(torch, 256, 256, False)
             + [nn.MaxPool2d((2, 1), (2, 1))] + _conv_bn_relu(torch, 256, 512) + _conv_bn_relu(torch, 512, 512, False)
             + [nn.MaxPool2d((2, 1), (2, 1)), nn.Conv2d(512, 512, 2, 1, 0), nn.BatchNorm2d(512), nn.ReLU()])
    net = _crnn_class(torch)(convs, 512, 256, 37)
    return net, (1, 1, height, width), fold_bn


def captcha_crnn(torch, fold_bn=False, height=64, width=160):
    """A small captcha CRNN (ddddocr-like): 4 conv blocks of SiLU with BatchNorm, pools to height 4, BiLSTM(128), 64 classes."""
    nn = torch.nn
    convs = []
    for cin, cout in ((1, 32), (32, 64), (64, 96), (96, 128)):
        convs += [nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.SiLU(), nn.MaxPool2d(2, 2)]
    net = _crnn_class(torch)(convs, 128 * (height // 16), 128, 64, layers=1)
    return net, (1, 1, height, width), fold_bn


def small_lstm(torch, steps=300, features=40, hidden=150):
    """A 2-layer LSTM of 150 units at batch 1 (a streaming acoustic model's size) with a Linear head."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(features, hidden, num_layers=2)
            self.fc = nn.Linear(hidden, 10)

        def forward(self, x):
            return self.fc(self.rnn(x)[0])

    return Net(), (steps, 1, features), True


def dense_head(torch, steps=200, batch=4, features=64, hidden=256):
    """LSTM(256) -> Linear -> LayerNorm -> GELU -> Linear -> Softmax: a tagger's head over every step."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(features, hidden)
            self.head = nn.Sequential(nn.Linear(hidden, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 48))

        def forward(self, x):
            return self.head(self.rnn(x)[0]).softmax(-1)

    return Net(), (steps, batch, features), True


def separable_gru(torch, frames=20, bins=32):
    """DeepFilterNet's kinds of layers: a grouped conv, a depthwise conv striding the frequency axis and a pointwise one,
    a depthwise transposed conv back up, a grouped linear layer (einsum), a GRU over the frames and a tanh head."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv0 = nn.Conv2d(2, 16, 3, padding=1, groups=2)
            self.down = nn.Sequential(nn.Conv2d(16, 16, (1, 3), stride=(1, 2), padding=(0, 1), groups=16),
                                      nn.Conv2d(16, 16, 1), nn.ReLU())
            self.up = nn.ConvTranspose2d(16, 16, (1, 3), stride=(1, 2), padding=(0, 1), output_padding=(0, 1), groups=16)
            self.grouped = nn.Parameter(torch.randn(4, 128, 32) / 12)
            self.gru = nn.GRU(128, 64, batch_first=True)
            self.out = nn.Linear(64, 8)

        def forward(self, x):
            a = self.conv0(x).relu()
            c = self.up(self.down(a)).relu() + a
            seq = c.permute(0, 2, 1, 3).reshape(1, frames, 4, 128)
            y, _ = self.gru(torch.einsum("btgi,gih->btgh", seq, self.grouped).reshape(1, frames, 128))
            return self.out(y).tanh()

    return Net(), (1, 2, frames, bins), True


CASES = {"vgg-crnn": vgg_crnn, "captcha-crnn": captcha_crnn, "lstm150-b1": small_lstm, "dense-head": dense_head,
         "separable-gru": separable_gru}


def _export(torch, net, shape, fold_bn):
    """The eval-mode model through torch.onnx's TorchScript exporter (opset 17): with fold_bn its constant folding
    folds BatchNorm into the convolutions, as most exported models have it; without, BatchNormalization nodes stay."""
    torch.manual_seed(0)
    net.eval()
    _randomize_bn(net, torch)
    x = torch.randn(*shape)
    buf = io.BytesIO()
    mode = torch.onnx.TrainingMode.EVAL if fold_bn else torch.onnx.TrainingMode.PRESERVE
    with torch.no_grad():
        torch.onnx.export(net, (x,), buf, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False,
                          training=mode, do_constant_folding=True)
    return onnx.load_from_string(buf.getvalue()), {"x": x.numpy()}


def build(name):
    import torch

    return _export(torch, *CASES[name](torch))


def torch_net(path):
    """The eval-mode torch module of a file `python tests/graph_cases.py DIR` wrote (by its name), or None: the PyTorch
    eager column of `tvmrnn bench --model FILE --torch graph_cases:torch_net`. Same architecture, not the same weights."""
    import torch

    name = os.path.splitext(os.path.basename(path))[0]
    if name not in CASES:
        return None
    net = CASES[name](torch)[0].eval()
    _randomize_bn(net, torch)
    return net


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    for name in CASES:
        model, feeds = build(name)
        onnx.save(model, os.path.join(out, name + ".onnx"))
        print(name, {k: v.shape for k, v in feeds.items()}, sorted({n.op_type for n in model.graph.node}))
