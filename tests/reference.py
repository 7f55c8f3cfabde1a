"""A float64 NumPy reference of ONNX's LSTM, GRU and RNN, written from the operator spec.

Independent of tvmrnn's code (it shares no helpers with it), so both can be checked against
each other and against ONNX Runtime. Semantics follow ONNX Runtime where the spec is silent:
steps past a row's sequence length write zeros to Y and keep the state; the reverse direction
runs each row from its last valid step back to step 0; clip bounds every gate's
pre-activation.
"""

from __future__ import annotations

import numpy as np

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
# ONNX defaults of activation_alpha / activation_beta; None: the function takes none.
ACT_DEFAULTS = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None), "ScaledTanh": (1.0, 1.0),
                "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None)}


def activation(name, alpha, beta):
    return {
        "Relu": lambda x: np.maximum(x, 0),
        "Tanh": np.tanh,
        "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "Affine": lambda x: alpha * x + beta,
        "LeakyRelu": lambda x: np.where(x >= 0, x, alpha * x),
        "ThresholdedRelu": lambda x: np.where(x > alpha, x, 0),
        "ScaledTanh": lambda x: alpha * np.tanh(beta * x),
        "HardSigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "Elu": lambda x: np.where(x >= 0, x, alpha * (np.exp(x) - 1)),
        "Softsign": lambda x: x / (1 + np.abs(x)),
        "Softplus": lambda x: np.log1p(np.exp(x)),
    }[name]


def resolve_activations(op, names, alphas, betas, num_directions):
    names = list(names or DEFAULT_ACTS[op] * num_directions)
    alphas, betas = list(alphas or []), list(betas or [])
    funcs = []
    for n in names:
        da, db = ACT_DEFAULTS.get(n, (None, None))
        a = (alphas.pop(0) if alphas else da) if da is not None else None
        b = (betas.pop(0) if betas else db) if db is not None else None
        funcs.append(activation(n, a, b))
    k = len(DEFAULT_ACTS[op])
    return [funcs[d * k:(d + 1) * k] for d in range(num_directions)]


def rnn_reference(op, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *, hidden_size=None,
                  direction="forward", layout=0, activations=None, activation_alpha=None, activation_beta=None,
                  clip=None, input_forget=0, linear_before_reset=0):
    """Returns [Y, Y_h] (+ [Y_c] for LSTM) in float64, in the node's layout."""
    f64 = lambda a: None if a is None else np.asarray(a, np.float64)  # noqa: E731
    X, W, R, B, initial_h, initial_c, P = map(f64, (X, W, R, B, initial_h, initial_c, P))
    if layout == 1:
        X = X.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    T, N, _ = X.shape
    D = W.shape[0]
    G, H = GATES[op], R.shape[-1]
    B = np.zeros((D, 2 * G * H)) if B is None else B
    lens = np.full(N, T) if sequence_lens is None else np.asarray(sequence_lens)
    h0 = np.zeros((D, N, H)) if initial_h is None else initial_h
    c0 = np.zeros((D, N, H)) if initial_c is None else initial_c
    P = np.zeros((D, 3 * H)) if P is None else P
    acts = resolve_activations(op, activations, activation_alpha, activation_beta, D)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]

    Y = np.zeros((T, D, N, H))
    Yh, Yc = np.zeros((D, N, H)), np.zeros((D, N, H))
    for d in range(D):
        f, g = acts[d][0], acts[d][1] if op != "RNN" else None
        w, r = W[d], R[d]
        wb, rb = B[d, :G * H], B[d, G * H:]
        for n in range(N):
            h, c = h0[d, n].copy(), c0[d, n].copy()
            L = int(lens[n])
            for s in range(L):
                t = L - 1 - s if reverse[d] else s
                xw = w @ X[t, n] + wb
                if op == "RNN":
                    h = f(cl(xw + r @ h + rb))
                elif op == "GRU":
                    z = f(cl(xw[:H] + r[:H] @ h + rb[:H]))
                    rr = f(cl(xw[H:2 * H] + r[H:2 * H] @ h + rb[H:2 * H]))
                    if linear_before_reset:
                        hh = g(cl(xw[2 * H:] + rr * (r[2 * H:] @ h + rb[2 * H:])))
                    else:
                        hh = g(cl(xw[2 * H:] + r[2 * H:] @ (rr * h) + rb[2 * H:]))
                    h = (1 - z) * hh + z * h
                else:
                    pre = xw + r @ h + rb
                    pi, po, pf = P[d, :H], P[d, H:2 * H], P[d, 2 * H:]
                    i = f(cl(pre[:H] + pi * c))
                    fg = 1 - i if input_forget else f(cl(pre[2 * H:3 * H] + pf * c))
                    c = fg * c + i * g(cl(pre[3 * H:]))
                    o = f(cl(pre[H:2 * H] + po * c))
                    h = o * acts[d][2](c)
                Y[t, d, n] = h
            Yh[d, n], Yc[d, n] = h, c
    if layout == 1:
        Y, Yh, Yc = Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    return [Y, Yh, Yc] if op == "LSTM" else [Y, Yh]
