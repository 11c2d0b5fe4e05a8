"""qkv.KvCache and qkv.PagedKvCache: decoding steps against attention over the whole prefix
written out in float64 (causal, bottom-right: the queries are the last positions)."""

import numpy as np
import pytest
import torch
from conftest import TOLERANCE, assert_close, explicit

import qkv

KV_HEADS, HEADS, D_K, D_V = 2, 4, 8, 6


def history(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(HEADS, n, D_K, generator=gen), torch.randn(KV_HEADS, n, D_K, generator=gen),
            torch.randn(KV_HEADS, n, D_V, generator=gen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_cache_steps_match_attention_over_the_prefix(dtype):
    q, k, v = history(20)
    cache = qkv.KvCache(layers=2, kv_heads=KV_HEADS, capacity=32, key_dim=D_K, value_dim=D_V, dtype=dtype)
    stored = [t.to(dtype).float() for t in (k, v)]
    # A prefill of 5 positions, then one position per step, on layer 1.
    ends = [5] + list(range(6, 21))
    start = 0
    for end in ends:
        cache.append(1, k[:, start:end], v[:, start:end])
        out = cache.attend(1, q[:, start:end])
        want, _ = explicit(q[:, start:end], stored[0][:, :end], stored[1][:, :end], is_causal=True, bottom_right=True)
        assert out.dtype == torch.float32
        assert_close(out, want, dtype, f"end {end}")
        start = end
    assert cache.length(1) == 20 and cache.length(0) == 0
    cache.clear()
    assert cache.length(1) == 0


def test_kv_cache_options_and_logsumexp():
    q, k, v = history(12)
    cache = qkv.KvCache(1, KV_HEADS, 16, D_K, D_V)
    cache.append(0, k, v)
    keep = torch.rand(3, 12, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[:, -3:] = True
    slopes = qkv.alibi_slopes(HEADS)
    out, lse = cache.attend(0, q[:, -3:], scale=0.5, sliding_window=(6, 0), alibi_slopes=slopes, softcap=4.0,
                            keep=keep, return_lse=True)
    want, want_lse = explicit(q[:, -3:], k, v, is_causal=True, scale=0.5, window=(6, 0), alibi=slopes,
                              softcap=4.0, keep=keep, bottom_right=True)
    assert_close(out, want, torch.float32)
    assert_close(lse, want_lse, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, "int8"])
def test_kv_cache_sinks_join_each_row_once(dtype):
    # A windowed ring (its keys in two runs, merged before the sink joins) and gpt-oss's sinks.
    q, k, v = history(12)
    cache = qkv.KvCache(1, KV_HEADS, capacity=8, key_dim=D_K, value_dim=D_V, dtype=dtype, window=6)
    sinks = [1.0, -2.0, 0.5, -float("inf")]
    for end in range(2, 13, 2):
        cache.append(0, k[:, end - 2:end], v[:, end - 2:end])
        out, lse = cache.attend(0, q[:, end - 2:end], sinks=torch.tensor(sinks), return_lse=True)
        stored = [dequantized(t) if dtype == "int8" else t for t in (k[:, :end], v[:, :end])]
        want, want_lse = explicit(q[:, end - 2:end], *stored, is_causal=True, window=(5, 0), bottom_right=True,
                                  sinks=sinks)
        assert_close(out, want, torch.float32, f"end {end}")
        assert_close(lse, want_lse, torch.float32, f"end {end} lse")
    with pytest.raises(ValueError, match="sinks has 2 logits for 4 query heads"):
        cache.attend(0, q[:, -1:], sinks=[0.0, 0.0])


def test_paged_cache_sinks_match_dense_attention():
    cache = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=16, blocks=16)
    seqs = [history(n, seed) for n, seed in ((40, 1), (9, 2))]
    ids = [cache.add_sequence() for _ in seqs]
    for seq, (_, k, v) in zip(ids, seqs):
        cache.append(0, seq, k, v)
    sinks = np.array([0.0, 3.0, -1.0, 2.0])
    q = torch.cat([s[0][:, -1:] for s in seqs], 1)
    out = cache.attend(0, ids, [0, 1, 2], q, sinks=sinks)
    for i, (sq, k, v) in enumerate(seqs):
        want, _ = explicit(sq[:, -1:], k, v, is_causal=True, bottom_right=True, sinks=sinks)
        assert_close(out[:, i:i + 1], want, torch.float32, f"sequence {i}")


def test_windowed_kv_cache_keeps_only_the_window():
    q, k, v = history(30)
    cache = qkv.KvCache(1, KV_HEADS, capacity=5, key_dim=D_K, value_dim=D_V, window=4)
    assert cache.window == 4
    for end in range(2, 31, 2):
        cache.append(0, k[:, end - 2:end], v[:, end - 2:end])
        out = cache.attend(0, q[:, end - 2:end])
        want, _ = explicit(q[:, end - 2:end], k[:, :end], v[:, :end], is_causal=True, window=(3, 0), bottom_right=True)
        assert_close(out, want, torch.float32, f"end {end}")
    assert (cache.length(0), cache.held(0)) == (30, 5)


def test_sink_tokens_stay_beside_the_window():
    q, k, v = history(30)
    sinks = 2
    # The sink tokens' slots, then the window and the step's other query: no slot to spare.
    cache = qkv.KvCache(1, KV_HEADS, capacity=sinks + 4 + 1, key_dim=D_K, value_dim=D_V, window=4, sink_tokens=sinks)
    for end in range(2, 31, 2):
        cache.append(0, k[:, end - 2:end], v[:, end - 2:end])
        out = cache.attend(0, q[:, end - 2:end])
        # Query r is position end - 2 + r: it sees positions 0 and 1, and its window of 4.
        positions = torch.arange(end)
        keep = torch.stack([(positions < sinks) | (positions >= end - 2 + r - 3) for r in range(2)])
        want, _ = explicit(q[:, end - 2:end], k[:, :end], v[:, :end], is_causal=True, keep=keep, bottom_right=True)
        assert_close(out, want, torch.float32, f"end {end}")
    with pytest.raises(ValueError, match="sink"):
        qkv.KvCache(1, KV_HEADS, capacity=5, key_dim=D_K, value_dim=D_V, sink_tokens=2)


def test_evicting_what_the_window_left_lets_a_generation_outrun_the_pool():
    window, steps = 6, 40
    # 8 blocks of 4 positions: 32 in all, fewer than the generation's 40.
    cache = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=4, blocks=8)
    seq = cache.add_sequence()
    q, k, v = history(steps, seed=7)
    for p in range(steps):
        cache.append(0, seq, k[:, p:p + 1], v[:, p:p + 1])
        out = cache.attend(0, [seq], [0, 1], q[:, p:p + 1], sliding_window=(window - 1, 0))
        want, _ = explicit(q[:, p:p + 1], k[:, :p + 1], v[:, :p + 1], is_causal=True, window=(window - 1, 0),
                           bottom_right=True)
        assert_close(out, want, torch.float32, f"position {p}")
        # The next query's window starts at p + 2 - window.
        cache.evict_before(seq, max(p + 2 - window, 0))
    assert cache.length(seq) == steps and cache.first_held(seq) > 0
    assert cache.first_held(seq) <= steps + 1 - window
    with pytest.raises(ValueError):
        cache.evict_before(seq, steps + 1)
    with pytest.raises(ValueError):
        cache.truncate(seq, 1)


def test_kv_cache_takes_numpy():
    q, k, v = (t.numpy() for t in history(4))
    cache = qkv.KvCache(1, KV_HEADS, 8, D_K, D_V, dtype=np.float32)
    cache.append(0, k, v)
    out = cache.attend(0, q[:, -1:])
    assert isinstance(out, np.ndarray)
    want, _ = explicit(*(torch.from_numpy(t) for t in (q[:, -1:], k, v)), is_causal=True, bottom_right=True)
    assert_close(torch.from_numpy(out), want, torch.float32)


def test_kv_cache_errors():
    cache = qkv.KvCache(1, KV_HEADS, 4, D_K, D_V)
    q, k, v = history(5)
    with pytest.raises(ValueError, match="capacity"):
        cache.append(0, k, v)
    with pytest.raises(ValueError, match="layer"):
        cache.append(3, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="keys"):
        cache.append(0, k[:1, :1], v[:, :1])
    with pytest.raises(ValueError, match="dtype"):
        qkv.KvCache(1, 1, 4, 4, 4, dtype="int4")
    with pytest.raises(ValueError, match="is empty"):
        qkv.KvCache(0, 1, 4, 4, 4)
    cache.append(0, k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match="queries"):
        cache.attend(0, q[:3, -1:])
    # A cache computes in float32, which holds at most 3.4e38.
    with pytest.raises(ValueError, match=r"^sinks\[2\] is 1e300: float32, the type these inputs compute in"):
        cache.attend(0, q[:, -1:], sinks=[0.0, 0.0, 1e300, 0.0])
    with pytest.raises(ValueError, match=r"^scale is 1e39: float32"):
        cache.attend(0, q[:, -1:], scale=1e39)


def test_caches_refuse_what_the_engine_cannot_read_and_read_the_rest_as_their_values():
    """Tensors on another device and integer keys are errors naming them; NumPy arrays with
    negative strides and torch's lazily negated tensors are read as their values."""
    for make in (lambda: qkv.KvCache(1, 1, 8, 4), lambda: qkv.PagedKvCache(1, 1, 4, 4, 16, 2)):
        cache = make()
        paged = isinstance(cache, qkv.PagedKvCache)
        seq = [cache.add_sequence()] if paged else []
        append = (lambda k, v: cache.append(0, *seq, k, v))
        attend = (lambda q, **kw: cache.attend(0, seq, [0, 1], q, **kw) if paged else cache.attend(0, q, **kw))
        meta = torch.empty(1, 2, 4, device="meta")
        with pytest.raises(ValueError, match="key is on meta: qkv runs on the CPU"):
            append(meta, meta)
        with pytest.raises(ValueError, match="value has dtype int64: the cache takes float32"):
            append(torch.ones(1, 2, 4), torch.ones(1, 2, 4, dtype=torch.int64))
        keys = np.random.default_rng(2).standard_normal((1, 6, 4)).astype(np.float32)[:, ::-1]
        append(keys, keys[:, ::-1])
        query = torch.randn(1, 1, 4, dtype=torch.complex64).conj().imag
        with pytest.raises(ValueError, match="query has dtype int64"):
            attend(torch.ones(1, 1, 4, dtype=torch.int64).numpy())
        with pytest.raises(ValueError, match="keep has dtype float32: it is a boolean mask"):
            attend(query.resolve_neg().numpy(), keep=np.ones((1, 6), dtype=np.float32))
        keep = np.array([[True, False, True, True, False, True]])[:, ::-1]
        got = attend(query.resolve_neg().numpy(), keep=keep)
        k, v = torch.from_numpy(keys.copy()), torch.from_numpy(keys[:, ::-1].copy())
        want, _ = explicit(query.resolve_neg(), k, v, keep=torch.from_numpy(keep.copy()))
        assert_close(torch.from_numpy(got), want, torch.float32)
        cache.truncate(*seq, 0) if paged else cache.clear()
        negated = (k * 1j).to(torch.complex64).conj().imag  # -k, lazily
        assert negated.is_neg() and query.is_neg()
        append(negated, v)
        want, _ = explicit(query.resolve_neg(), -k, v, is_causal=True, bottom_right=True)
        assert_close(attend(query), want, torch.float32)


def test_negative_and_fractional_numbers_are_errors_naming_them():
    kv = qkv.KvCache(2, 1, 8, 4)
    paged = qkv.PagedKvCache(2, 1, 4, block_size=16, blocks=2)
    seq = paged.add_sequence()
    x = torch.ones(1, 1, 4)
    for call, name, value in (
        (lambda: qkv.KvCache(2, 1, -8, 4), "capacity", -8),
        (lambda: kv.append(-1, x, x), "layer", -1),
        (lambda: kv.attend(-1, x), "layer", -1),
        (lambda: kv.truncate(-2), "length", -2),
        (lambda: qkv.PagedKvCache(1, 1, 4, blocks=-3), "blocks", -3),
        (lambda: paged.append(0, -1, x, x), "seq", -1),
        (lambda: paged.attend(0, [seq], [0, -1], x), r"offsets\[1\]", -1),
        (lambda: paged.evict_before(seq, -5), "position", -5),
    ):
        with pytest.raises(ValueError, match=rf"^{name} is {value}: .* count from 0"):
            call()
    with pytest.raises(ValueError, match=r"^length is 1180591620717411303424: more than a 64-bit count holds"):
        kv.truncate(2**70)
    with pytest.raises(TypeError, match=r"^layer is 1.5: it is a whole number"):
        kv.length(1.5)
    assert kv.length(np.int64(1)) == 0


def test_cache_steps_refuse_what_needs_a_gradient():
    """A cache has no backward: keys, values, a query or sinks that need a gradient raise rather
    than drop it; under no_grad the same calls run."""
    q, k, v = history(2)
    query = q[:, -1:].clone().requires_grad_()
    sinks = torch.zeros(HEADS, requires_grad=True)
    cache = qkv.KvCache(1, KV_HEADS, 4, D_K, D_V)
    with pytest.raises(ValueError, match=r"^key, value require grad, and KvCache\.append has no backward"):
        cache.append(0, k.clone().requires_grad_(), v.clone().requires_grad_())
    cache.append(0, k, v)
    with pytest.raises(ValueError, match=r"^query requires grad, and KvCache\.attend has no backward"):
        cache.attend(0, query)
    with pytest.raises(ValueError, match=r"^sinks requires grad, and KvCache\.attend has no backward"):
        cache.attend(0, q[:, -1:], sinks=sinks)
    paged = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=4, blocks=2)
    seq = paged.add_sequence()
    with pytest.raises(ValueError, match=r"^value requires grad, and PagedKvCache\.append has no backward"):
        paged.append(0, seq, k, v.clone().requires_grad_())
    paged.append(0, seq, k, v)
    with pytest.raises(ValueError, match=r"^query, sinks require grad, and PagedKvCache\.attend has no"):
        paged.attend(0, [seq], [0, 1], query, sinks=sinks)
    with torch.no_grad():
        assert cache.attend(0, query).shape == (HEADS, 1, D_V)
        # The engine's errors name the arguments as passed (it calls them keep_mask, query_offsets).
        with pytest.raises(ValueError, match=r"takes keep of shape \[1, 2\], not \[1, 3\]"):
            cache.attend(0, query, keep=torch.ones(1, 3, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"^offsets \[0, 2\] do not fit 1 sequence and 1 packed row"):
            paged.attend(0, [seq], [0, 2], query)
        assert paged.attend(0, [seq], [0, 1], query, sinks=sinks).shape == (HEADS, 1, D_V)


def dequantized(x):
    """``x`` (``[heads, n, d]``) as an int8 cache holds it, written out here: one scale per head
    and position, ``max |x| / 127``, and each element ``round(x / scale) · scale``."""
    scale = x.abs().amax(-1, keepdim=True) / 127
    return torch.where(scale > 0, torch.round(x / scale), torch.zeros_like(x)) * scale


def int8_bound(query, key, value):
    """The int8 cache's error bound per output against the keys and values as appended:
    ``(e^{2δ} - 1) · max |v| + max |v| / 254`` with ``δ = scale · ‖q‖₁ · max |k| / 254``."""
    delta = query.abs().sum(-1).max().item() / query.shape[-1] ** 0.5 * key.abs().max().item() / 254
    top = value.abs().max().item()
    return (np.exp(2 * delta) - 1) * top + top / 254


@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_kv_cache_steps_match_attention_over_the_quantized_prefix(query_dtype):
    q, k, v = history(20)
    cache = qkv.KvCache(layers=2, kv_heads=KV_HEADS, capacity=32, key_dim=D_K, value_dim=D_V, dtype="int8")
    assert cache.dtype == "int8"
    held = [dequantized(t) for t in (k, v)]
    start = 0
    for end in [5] + list(range(6, 21)):
        # Keys and values in any dtype are appended as float32.
        cache.append(1, k[:, start:end].double(), v[:, start:end])
        query = q[:, start:end].to(query_dtype)
        out = cache.attend(1, query)
        want, _ = explicit(query.float(), held[0][:, :end], held[1][:, :end], is_causal=True, bottom_right=True)
        assert out.dtype == torch.float32
        assert_close(out, want, torch.float32 if query_dtype == torch.float32 else query_dtype, f"end {end}")
        exact, _ = explicit(query.float(), k[:, :end], v[:, :end], is_causal=True, bottom_right=True)
        bound = int8_bound(query.float(), k[:, :end], v[:, :end])
        assert (out.double() - exact).abs().max().item() <= bound, f"end {end}: beyond the int8 bound {bound}"
        start = end


def test_int8_paged_cache_runs_a_ragged_batch_over_the_quantized_keys():
    cache = qkv.PagedKvCache(layers=1, kv_heads=KV_HEADS, key_dim=D_K, value_dim=D_V, block_size=16, blocks=16,
                             dtype="int8")
    seqs = [history(n, seed) for n, seed in ((40, 4), (7, 5))]
    ids = [cache.add_sequence() for _ in seqs]
    for seq, (_, k, v) in zip(ids, seqs):
        cache.append(0, seq, k, v)
    q = torch.cat([s[0][:, -1:] for s in seqs], 1)
    out = cache.attend(0, ids, [0, 1, 2], q)
    for i, (sq, k, v) in enumerate(seqs):
        want, _ = explicit(sq[:, -1:], dequantized(k), dequantized(v), is_causal=True, bottom_right=True)
        assert_close(out[:, i:i + 1], want, torch.float32, f"sequence {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [64, 16, 5])
def test_paged_cache_runs_a_ragged_batch_like_dense_attention(dtype, block_size):
    block = qkv.PagedKvCache.block_granularity()
    assert 64 % block == 0
    # 64 is whole panels at every level, vLLM's 16 and 5 are padded where a panel is wider.
    cache = qkv.PagedKvCache(layers=1, kv_heads=KV_HEADS, key_dim=D_K, value_dim=D_V, block_size=block_size,
                             blocks=512 // block_size, dtype=dtype)
    seqs = [history(n, seed) for n, seed in ((70, 1), (3, 2), (40, 3))]
    ids = [cache.add_sequence() for _ in seqs]
    for seq, (_, k, v) in zip(ids, seqs):
        cache.append(0, seq, k, v)
    # Sequence 0 a decoding step, 1 its whole prefill of 3, 2 two queries.
    counts = [1, 3, 2]
    q = torch.cat([s[0][:, -c:] for s, c in zip(seqs, counts)], 1)
    offsets = np.cumsum([0] + counts).tolist()
    # float32 queries as they are (a bfloat16 pool too, as KvCache takes them), and queries in
    # the pool's own dtype.
    for queries in (q, q.to(dtype)):
        out, lse = cache.attend(0, ids, offsets, queries, return_lse=True)
        for i, ((sq, k, v), c) in enumerate(zip(seqs, counts)):
            stored = [sq[:, -c:].to(queries.dtype).float()] + [t.to(dtype).float() for t in (k, v)]
            want, want_lse = explicit(*stored, is_causal=True, bottom_right=True)
            rows = slice(offsets[i], offsets[i + 1])
            # Within float32's error of the keys and values stored, whatever the queries.
            assert_close(out[:, rows], want, torch.float32, f"sequence {i}, {queries.dtype} queries")
            assert_close(lse[:, rows], want_lse, torch.float32, f"sequence {i} lse, {queries.dtype} queries")
    assert cache.length(ids[0]) == 70


@pytest.mark.parametrize("window", [None, 4])
def test_kv_cache_truncate_rolls_back_a_rejected_draft(window):
    """A draft of 3 positions appended and then rolled back, then the accepted token appended:
    the step equals that of a cache that never held the draft, bit for bit."""
    q, k, v = history(9)
    caches = [qkv.KvCache(2, KV_HEADS, 8, D_K, D_V, window=window) for _ in range(2)]
    drafted, never = caches
    for layer in (0, 1):
        drafted.append(layer, k[:, :8], v[:, :8])
        never.append(layer, k[:, :5], v[:, :5])
    drafted.truncate(5)
    assert [drafted.length(layer) for layer in (0, 1)] == [5, 5]
    for cache in caches:
        cache.append(0, k[:, 8:9], v[:, 8:9])
    assert torch.equal(drafted.attend(0, q[:, 8:9]), never.attend(0, q[:, 8:9]))
    with pytest.raises(ValueError, match="truncation only removes positions"):
        drafted.truncate(7)
    assert drafted.length(0) == 6


def test_paged_cache_fork_truncate_free():
    cache = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=64, blocks=4)
    q, k, v = history(10)
    a = cache.add_sequence()
    cache.append(0, a, k[:, :8], v[:, :8])
    b = cache.fork(a)
    assert cache.free_blocks() == 3  # shared until written
    cache.append(0, b, k[:, 8:], v[:, 8:])
    assert cache.free_blocks() == 2  # copied on write
    cache.truncate(b, 8)
    out_a = cache.attend(0, [a], [0, 1], q[:, 7:8])
    out_b = cache.attend(0, [b], [0, 1], q[:, 7:8])
    assert torch.equal(out_a, out_b)
    cache.free(b)
    assert cache.free_blocks() == 3
    with pytest.raises(ValueError, match=f"sequence {b} is not in this cache"):
        cache.length(b)
    # Another cache's first sequence is refused here, though it is that cache's sequence 0 too.
    other = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=64, blocks=4)
    theirs = other.add_sequence()
    for call in (lambda: cache.length(theirs), lambda: cache.append(0, theirs, k[:, :1], v[:, :1]),
                 lambda: cache.free(theirs)):
        with pytest.raises(ValueError, match=f"sequence {theirs} is not in this cache"):
            call()
    assert (cache.length(a), other.length(theirs)) == (8, 0)
    # Any block size works (a block's keys are padded to whole panels); an empty one does not.
    qkv.PagedKvCache(1, 1, 4, 4, block_size=3, blocks=2)
    with pytest.raises(ValueError, match="blocks of at least one position"):
        qkv.PagedKvCache(1, 1, 4, 4, block_size=0, blocks=2)
    big = history(300)
    with pytest.raises(ValueError, match="appending 300 positions"):
        cache.append(0, a, big[1], big[2])


def test_paged_errors_name_sequences_by_the_callers_handles():
    """The engine numbers a cache's sequences by slot (a freed one's slot goes to the next); the
    package's handles are distinct across the process. Every message names the handle the caller
    holds, never a slot that may be another handle."""
    # Handles of other caches first, so that slots and handles differ.
    others = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=64, blocks=4)
    for _ in range(3):
        others.add_sequence()
    cache = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=64, blocks=2)
    freed = cache.add_sequence()
    cache.free(freed)
    a, b = cache.add_sequence(), cache.add_sequence()  # a takes the freed slot 0, b slot 1
    assert (a, b) != (0, 1)
    q, k, v = history(200)
    cache.append(0, b, k[:, :3], v[:, :3])
    cases = [
        (lambda: cache.append(0, b, k, v), f"to sequence {b} "),
        (lambda: cache.truncate(b, 9), f"sequence {b} holds 3 positions"),
        (lambda: cache.evict_before(b, 9), f"sequence {b} cannot evict"),
        (lambda: cache.attend(0, [b, b], [0, 1, 2], q[:, :2]), rf"sequences\[1\] repeats sequences\[0\] \(sequence {b}\)"),
        (lambda: cache.attend(0, [a, b], [0, 1, 2], q[:, :2]), rf"sequences\[0\] \(sequence {a}\)"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # Copies would share the engine's memory; pickling has nothing to carry.
    import copy
    import pickle

    for refused in (lambda: copy.copy(cache), lambda: copy.deepcopy(cache), lambda: pickle.dumps(cache),
                    lambda: copy.copy(qkv.KvCache(1, KV_HEADS, 8, D_K, D_V))):
        with pytest.raises(TypeError, match="cannot be (copied|pickled)"):
            refused()
    assert cache.length(b) == 3, "nothing changed"


def rotated(x, first, base, interleaved, dims=None, scale=1.0):
    """``x`` (``[heads, n, d]``) turned by a rotary embedding written out in float64, row ``i`` at
    position ``first + i``: Hugging Face's ``rotate_half`` over the first ``dims`` components, or
    GPT-J's interleaved pairs."""
    x = x.double().clone()
    d = dims or x.shape[-1]
    half = d // 2
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    angles = (first + torch.arange(x.shape[-2], dtype=torch.float64))[:, None] * scale * theta
    cos, sin = angles.cos(), angles.sin()
    part = x[..., :d]
    a, b = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half], part[..., half:])
    turned_a, turned_b = a * cos - b * sin, a * sin + b * cos
    if interleaved:
        part[..., 0::2], part[..., 1::2] = turned_a, turned_b
    else:
        part[..., :half], part[..., half:] = turned_a, turned_b
    return x


@pytest.mark.parametrize("rotary", [qkv.Rotary(10000.0), qkv.Rotary(100.0, interleaved=True),
                                    qkv.Rotary(500.0, dims=4, position_scale=0.5)])
def test_caches_apply_a_rotary_embedding_by_absolute_position(rotary):
    """A cache made with ``rotary`` equals attention over keys and queries turned by the
    embedding written out here (prefill, then decoding steps; the paged cache beside a second
    sequence, after evicting, whose positions keep their numbers)."""
    base, interleaved, dims, scale = rotary
    q, k, v = history(24, seed=3)
    turn = (lambda x, first: rotated(x, first, base, interleaved, dims, scale))
    cache = qkv.KvCache(1, KV_HEADS, 32, D_K, D_V, rotary=rotary)
    paged = qkv.PagedKvCache(1, KV_HEADS, D_K, D_V, block_size=4, blocks=16, rotary=rotary)
    other, seq = paged.add_sequence(), paged.add_sequence()
    paged.append(0, other, k[:, :3], v[:, :3])
    for start, end in ((0, 10), (10, 11), (11, 12), (12, 24)):
        cache.append(0, k[:, start:end], v[:, start:end])
        paged.append(0, seq, k[:, start:end], v[:, start:end])
        want, _ = explicit(turn(q[:, start:end], start), turn(k[:, :end], 0), v[:, :end], is_causal=True,
                           bottom_right=True)
        assert_close(cache.attend(0, q[:, start:end]), want, torch.float32, f"KvCache to {end}")
        out = paged.attend(0, [other, seq], [0, 1, 1 + end - start], torch.cat([q[:, 2:3], q[:, start:end]], 1))
        assert_close(out[:, 1:], want, torch.float32, f"PagedKvCache to {end}")
    # Evicted positions keep their numbers: the window's keys turn as they did.
    paged.evict_before(seq, 16)
    window = (7, 0)
    want, _ = explicit(turn(q[:, 23:24], 23), turn(k[:, 16:24], 16), v[:, 16:24])
    assert_close(paged.attend(0, [seq], [0, 1], q[:, 23:24], sliding_window=window), want, torch.float32, "evicted")


def test_a_rotary_embedding_that_does_not_fit_is_an_error_naming_it():
    with pytest.raises(ValueError, match="rotary embedding"):
        qkv.KvCache(1, 1, 4, 5, rotary=qkv.Rotary())  # 5 components do not pair up
    with pytest.raises(ValueError, match="rotary embedding"):
        qkv.PagedKvCache(1, 1, 8, block_size=4, blocks=2, rotary=qkv.Rotary(dims=12))
    with pytest.raises(TypeError, match="it is a qkv.Rotary"):
        qkv.KvCache(1, 1, 4, 8, rotary=10000.0)
    with pytest.raises(TypeError, match="interleaved"):
        qkv.KvCache(1, 1, 4, 8, rotary=qkv.Rotary(interleaved="yes"))
    with pytest.raises(TypeError, match="base is 'x'"):
        qkv.KvCache(1, 1, 4, 8, rotary=qkv.Rotary("x"))


def test_a_numpy_bfloat16_cache_without_ml_dtypes_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ml_dtypes", None)
    cache = qkv.KvCache(1, 1, 4, 2, dtype="bfloat16")
    with pytest.raises(ModuleNotFoundError, match=r"pip install ml_dtypes"):
        cache.append(0, np.ones((1, 1, 2), np.float32), np.ones((1, 1, 2), np.float32))
