"""The cuDNN anchors the GPU benchmark compares with: cuDNN's own algorithms through cudnnRNNForward and PyTorch's cuDNN
replayed from a CUDA graph. GPU only (they time cuDNN)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def test_cudnn_algorithms_time_the_standard_and_agree_with_it():
    from tvmrnn.cudnn_anchors import cudnn_algorithms

    res = cudnn_algorithms("LSTM", 256, 256, 1, 50, 1, 1, "float32", repeats=3)
    assert res["cudnn_standard_fma_ms"] > 0
    # every algorithm is either timed (and agrees with STANDARD) or refused with cuDNN's reason
    for algo in ("persist_static", "persist_dynamic", "persist_static_small_h"):
        for math in ("fma", "default"):
            key = f"cudnn_{algo}_{math}"
            assert (key + "_ms" in res and res[key + "_rel_diff"] < 2e-2) or key + "_error" in res


def test_cuda_graph_replay_times_a_captured_lstm():
    from tvmrnn.cudnn_anchors import cuda_graph_ms

    net = torch.nn.LSTM(64, 64).cuda().eval()
    xs = [torch.randn(20, 2, 64, device="cuda") for _ in range(2)]
    assert cuda_graph_ms(net, xs, repeats=3, warmup=1) > 0
