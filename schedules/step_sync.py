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

Half words (HALF_WORD, the tensor-core kernel's B operand): a 32-bit word of the value's fp16/bf16 bits low and a
16-bit tag high, the step modulo 65535 (half_tag; 0xFFFF is INVALID). A slot only ever holds the tag of the step it is
read for, of the step two before (the double buffer) or INVALID, and those three differ, so 16 bits suffice; a warp
loads a lane's 8 words with two 16-byte relaxed loads, all of a round's loads issued before the first tag is checked,
and waits for the round's runs together (settle_runs): each pass reloads every run still lagging, so a round costs one
L2 round trip past its last producer's store, where a wait run by run paid one for each run found stale in turn.
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


HALF_WORD = "uint32"
PUBLISH_WORD = "tvmrnn_publish_word"
LOAD8 = "tvmrnn_load_words8"
PUBLISH_WORD_SRC = (f"__forceinline__ __device__ void {PUBLISH_WORD}(void* word, unsigned w) {{ "
                    'asm volatile("st.relaxed.gpu.b32 [%0], %1;" :: "l"(word), "r"(w) : "memory"); }')
SETTLE = "tvmrnn_settle_runs"


def _load8_at(base: str, ptr: str) -> str:
    """The two 16-byte relaxed loads of 8 words from `ptr` into the local words from `base`."""
    return "".join(f'asm volatile("ld.relaxed.gpu.v4.b32 {{%0, %1, %2, %3}}, [%4];" : "=r"({base}[{4 * h}]), "=r"({base}[{4 * h + 1}]), '
                   f'"=r"({base}[{4 * h + 2}]), "=r"({base}[{4 * h + 3}]) : "l"((const char*){ptr} + {16 * h})); ' for h in range(2))


LOAD8_SRC = f"__forceinline__ __device__ void {LOAD8}(unsigned* w, const void* words) {{ {_load8_at('w', 'words')}}}"


def settle_runs_src(runs: int) -> tuple[str, str]:
    """The device function that waits for `runs` runs of 8 words together: while any valid run's tags lag, it reloads
    every such run at once, so a round of loads waits one L2 round trip past its last producer, not one a run."""
    name = f"{SETTLE}{runs}"
    ptrs = ", ".join(f"const void* p{k}" for k in range(runs))
    lags = lambda k: " | ".join(f"(w[{8 * k + i}] ^ t)" for i in range(8))  # noqa: E731  (zero in the tag bits when on time)
    stale = " ".join(f"bool s{k} = ((valid >> {k}) & 1u) && ((({lags(k)}) >> 16) != 0u);" for k in range(runs))
    reload = " ".join(f"if (s{k}) {{ unsigned* r = w + {8 * k}; {_load8_at('r', f'p{k}')}}}" for k in range(runs))
    src = (f"__forceinline__ __device__ void {name}(unsigned* w, unsigned tag, unsigned valid, {ptrs}) {{ unsigned t = tag << 16; "
           f"for (;;) {{ {stale} if (!({' || '.join(f's{k}' for k in range(runs))})) break; {reload} }} }}")
    return name, src


def tag_of(step) -> tirx.PrimExpr:
    """The tag of what step `step` (an int64 PrimExpr or int) produced."""
    return tirx.IntImm(TAG, step) if isinstance(step, int) else step.astype(TAG)


def invalid() -> tirx.PrimExpr:
    return tirx.IntImm(TAG, INVALID)


def alloc_words(shape, half: bool = False) -> tirx.Buffer:
    """Global words for an operand of this shape (an extra leading 2 for a double buffer); half: HALF_WORD's."""
    return T.alloc_buffer(shape, HALF_WORD if half else WORD)


def half_tag(tag) -> tirx.PrimExpr:
    """A half word's 16-bit tag of a 32-bit one: the step modulo 65535, INVALID as 0xFFFF."""
    tag = tirx.IntImm(TAG, tag) if isinstance(tag, int) else tag
    return tirx.Select(tag == invalid(), tirx.IntImm(TAG, 0xFFFF), tirx.truncmod(tag, tirx.IntImm(TAG, 0xFFFF)))


def publish(words, idx, value, tag, dtype: str = "float16"):
    """Store fp32 `value` with `tag` into words[idx], as one 64-bit relaxed store; into a half word (HALF_WORD), as one
    32-bit relaxed store of its bits in `dtype` and the tag's low 16 (half_tag)."""
    if str(words.dtype) == HALF_WORD:
        bits = tirx.reinterpret("uint16", value.astype(dtype)).astype(TAG)
        word = tirx.bitwise_or(bits, tirx.shift_left(half_tag(tag), tirx.IntImm(TAG, 16)))
        T.evaluate(T.cuda.func_call(PUBLISH_WORD, tirx.address_of(words[tuple(idx)]), word, source_code=PUBLISH_WORD_SRC))
        return
    T.evaluate(T.cuda.func_call(PUBLISH, tirx.address_of(words[tuple(idx)]), value, tag, source_code=PUBLISH_SRC))


def wait(words, idx, tag, width: int = 1) -> tirx.PrimExpr:
    """The fp32 value at words[idx] (width 4: a float32x4 of it and the next three words, idx's last index a multiple
    of 4), once its tag is `tag`."""
    ptr = tirx.address_of(words[tuple(idx)])
    if width == 1:
        return T.cuda.func_call(WAIT1, ptr, tag, source_code=WAIT1_SRC, return_type="float32")
    assert width == 4, width
    return T.cuda.func_call(WAIT4, ptr, tag, source_code=WAIT4_SRC, return_type="float32x4")


def load8(dst, words, idx):
    """Issue the loads of words[idx..idx+7] into the local words at dst (an address), not waiting on them."""
    T.evaluate(T.cuda.func_call(LOAD8, dst, tirx.address_of(words[tuple(idx)]), source_code=LOAD8_SRC))


def settle_runs(dst, words, idxs, valid, tag16):
    """Until every word of the runs at dst (8 words a run, run k from words[idxs[k]..]) whose bit of `valid` is set
    carries tag16, load the lagging runs again, all at once (settle_runs_src)."""
    name, src = settle_runs_src(len(idxs))
    ptrs = [tirx.address_of(words[tuple(idx)]) for idx in idxs]
    T.evaluate(T.cuda.func_call(name, dst, tag16, valid, *ptrs, source_code=src))
