"""Step synchronization without a grid barrier: values published with their step number in the same 64-bit word.

A producer stores each value it shares as one aligned 64-bit word, the fp32 bits low and a 32-bit tag (the step that
produced it) high, with st.relaxed.gpu; a consumer polls the words it needs with ld.relaxed.gpu until every tag is the
step it waits for. A relaxed 64-bit access is single-copy atomic in the PTX memory model, so a consumer that sees the
tag sees the value stored with it, and no fence is needed: one L2 round trip a step instead of a barrier and a read.

What makes it safe in a recurrent kernel, where every block of a direction reads all of a batch row's operand and
writes its own units of it:
- a double buffer indexed by the step's parity suffices: a block writes row n of step t+1 only after it saw all of
  row n of step t, each unit of which its owner published after reading all of row n of step t-1 (the slot it
  overwrites). An operand written and read within one step (GRU's r*h) needs one buffer, by the same argument;
- stale tags from an earlier launch (the buffers are workspace the next launch may reuse) are overwritten at the
  start, before one grid barrier: slot 0 gets tag 0 with the initial state, every other word INVALID;
- every block polls, so all must be resident at once: the kernel stays a cooperative launch (the grid barrier above
  keeps the tag on it).
Tags are the step number modulo 2^32 (INVALID = 2^32 - 1): a sequence of 2^32 - 1 steps or more would wrap.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

WORD = "int64"  # the buffers' dtype (fp32 bits | tag << 32); the device functions take them as raw words
TAG = "uint32"
INVALID = 0xFFFFFFFF

PUBLISH = "tvmrnn_publish_tagged"
WAIT1 = "tvmrnn_wait_tagged"
WAIT4 = "tvmrnn_wait_tagged4"
_WORD_OF = "((unsigned long long)tag << 32) | __float_as_uint(value)"
PUBLISH_SRC = (f"__forceinline__ __device__ void {PUBLISH}(void* word, float value, unsigned tag) {{ "
               f"unsigned long long w = {_WORD_OF}; "
               'asm volatile("st.relaxed.gpu.b64 [%0], %1;" :: "l"(word), "l"(w) : "memory"); }')
# the poll: relaxed loads (L2, never a stale L1 line), the four words of a float4 in two 16-byte loads issued together
WAIT1_SRC = (f"__forceinline__ __device__ float {WAIT1}(const void* word, unsigned tag) {{ unsigned long long w; "
             'do { asm volatile("ld.relaxed.gpu.b64 %0, [%1];" : "=l"(w) : "l"(word)); } while ((unsigned)(w >> 32) != tag); '
             "return __uint_as_float((unsigned)w); }")
WAIT4_SRC = (f"__forceinline__ __device__ float4 {WAIT4}(const void* words, unsigned tag) {{ unsigned long long a, b, c, d; "
             'do { asm volatile("ld.relaxed.gpu.v2.b64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(words)); '
             'asm volatile("ld.relaxed.gpu.v2.b64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"((const char*)words + 16)); '
             "} while ((unsigned)(a >> 32) != tag || (unsigned)(b >> 32) != tag || (unsigned)(c >> 32) != tag || (unsigned)(d >> 32) != tag); "
             "return make_float4(__uint_as_float((unsigned)a), __uint_as_float((unsigned)b), __uint_as_float((unsigned)c), "
             "__uint_as_float((unsigned)d)); }")


def tag_of(step) -> tirx.PrimExpr:
    """The tag of what step `step` (an int64 PrimExpr or int) produced."""
    return tirx.IntImm(TAG, step) if isinstance(step, int) else step.astype(TAG)


def invalid() -> tirx.PrimExpr:
    return tirx.IntImm(TAG, INVALID)


def alloc_words(shape) -> tirx.Buffer:
    """Global words for an operand of this shape (an extra leading 2 for a double buffer)."""
    return T.alloc_buffer(shape, WORD)


def publish(words, idx, value, tag):
    """Store fp32 `value` with `tag` into words[idx], as one 64-bit relaxed store."""
    T.evaluate(T.cuda.func_call(PUBLISH, tirx.address_of(words[tuple(idx)]), value, tag, source_code=PUBLISH_SRC))


def wait(words, idx, tag, width: int = 1) -> tirx.PrimExpr:
    """The fp32 value at words[idx] (width 4: a float32x4 of it and the next three words, idx's last index a multiple
    of 4), once its tag is `tag`."""
    ptr = tirx.address_of(words[tuple(idx)])
    if width == 1:
        return T.cuda.func_call(WAIT1, ptr, tag, source_code=WAIT1_SRC, return_type="float32")
    assert width == 4, width
    return T.cuda.func_call(WAIT4, ptr, tag, source_code=WAIT4_SRC, return_type="float32x4")
