//! Heap allocations of a warm decoding step over a KV cache and of a batched one over a paged
//! cache (32 query heads over 8 key/value heads, d = 128, one query per sequence), and the large
//! ones of a warm backward, counted by this test binary's global allocator, which counts per
//! thread so that the tests running beside it do not add to the count. The allocator also fills
//! every block it is not asked to zero with `0xFF` bytes (NaN as f32 and f64), so that an element
//! the engine leaves unwritten in memory it did not zero reads as NaN in every test
//! (`outputs_the_engine_allocates_are_written_in_full`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ndarray::{Array2, Array3, Array4, ArrayView2};
use qkv::half::bf16;
use qkv::{
    AttentionOptions, CacheOptions, CacheShape, CacheStorage, GradientsMut, KvCache, PagedKvCache,
    PagedShape, Q8, SimdLevel, SlidingWindow, Storage,
};

use crate::problem::levels;

/// The system allocator, counting the allocations (and reallocations) of each thread.
struct CountingAllocator;

thread_local! {
    /// Allocations made by this thread so far. A `const` cell has no destructor, so it can be
    /// read while the thread is being torn down too.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Those of them of at least [`LARGE`] bytes.
    static LARGE_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The size from which an allocation counts as large: glibc's allocator maps blocks this large
/// from the OS afresh unless a larger one was freed before.
const LARGE: usize = 128 << 10;

fn count_one(bytes: usize) {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    if bytes >= LARGE {
        let _ = LARGE_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

/// Allocations this thread has made so far.
fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is passed to `System` unchanged; counting touches only a thread-local cell,
// and the poison only the block just allocated.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one(layout.size());
        // SAFETY: the caller's guarantees for `alloc` are `System.alloc`'s; a block it returns
        // holds `layout.size()` writable bytes.
        unsafe {
            let block = System.alloc(layout);
            if !block.is_null() {
                block.write_bytes(0xFF, layout.size());
            }
            block
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one(new_size);
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const SHAPE: CacheShape = CacheShape::new(1, 8, 2048, 128, 128);
const QUERY_HEADS: usize = 32;

/// The allocations of each of `steps` decoding steps after a warm-up step, over a cache at
/// `level` holding `len` positions, with `options`, as `count` counts them (this thread's by
/// default).
fn step_allocations(level: SimdLevel, len: usize, options: &CacheOptions, steps: usize) -> Vec<u64> {
    counted_steps::<f32, f32>(level, len, options, steps, &allocations)
}

/// [`step_allocations`] over a cache of `E` (f32 queries) into an output of `O`, as `count`
/// counts them.
fn counted_steps<E: CacheStorage, O: Storage>(
    level: SimdLevel,
    len: usize,
    options: &CacheOptions,
    steps: usize,
    count: &dyn Fn() -> u64,
) -> Vec<u64> {
    let mut cache = KvCache::<E>::for_level(SHAPE, level).unwrap();
    let mut layer = cache.layer(0).unwrap();
    let kv = Array3::from_shape_fn((SHAPE.kv_heads, len, 128), |(h, i, c)| {
        E::Appended::from_f32(((h + i * c) % 7) as f32 / 7.0)
    });
    layer.append(kv.view(), kv.view()).unwrap();
    let q = Array3::from_shape_fn((QUERY_HEADS, 1, 128), |(h, _, c)| ((h * c) % 5) as f32 / 5.0);
    let (mut out, mut lse) =
        (Array3::from_elem((QUERY_HEADS, 1, 128), O::from_f32(0.0)), Array2::zeros((QUERY_HEADS, 1)));
    layer.attend_with_into(q.view(), options, out.view_mut(), Some(lse.view_mut())).unwrap();
    (0..steps)
        .map(|_| {
            let before = count();
            layer.attend_with_into(q.view(), options, out.view_mut(), Some(lse.view_mut())).unwrap();
            count() - before
        })
        .collect()
}

/// The options a step is counted with: none, a window with soft-capping, and ALiBi, the last
/// two with a keep mask `keep` (`[1, held]`) as tree verification passes one.
fn step_options<'a>(slopes: &'a [f32], keep: ArrayView2<'a, bool>) -> [(&'static str, CacheOptions<'a>); 3] {
    let window = CacheOptions::new().sliding_window(SlidingWindow::new(300, 0)).logit_softcap(50.0);
    [
        ("plain", CacheOptions::new()),
        ("window + cap + keep", window.keep_mask(keep)),
        ("alibi + keep", CacheOptions::new().alibi(slopes).keep_mask(keep)),
    ]
}

/// A keep mask for one query over `held` positions: every third position hidden.
fn every_third_hidden(held: usize) -> Array2<bool> {
    Array2::from_shape_fn((1, held), |(_, j)| j % 3 != 1)
}

#[test]
fn a_warm_decoding_step_allocates_nothing_at_every_level() {
    let slopes = qkv::alibi_slopes::<f32>(QUERY_HEADS);
    // A pool of one thread runs every step on the calling thread, however long the cache: 2000
    // positions also split the keys into parts merged at the end.
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for level in levels() {
        for len in [1, 200, 2000] {
            let keep = every_third_hidden(len);
            for (what, options) in step_options(&slopes, keep.view()) {
                let counts = one_thread.install(|| step_allocations(level, len, &options, 3));
                assert_eq!(counts, [0, 0, 0], "{level} {what} over {len} positions, one thread");
                if len != 200 {
                    continue;
                }
                // A short step, from outside the pool: on the calling thread, or shared when it
                // follows the last closely (one boxed job per helper). One key split: an item per
                // key/value head.
                let items = SHAPE.kv_heads;
                let counts = step_allocations(level, len, &options, 3);
                assert!(inline_or_shared(&counts, items), "{level} {what}, {len} positions: {counts:?}");
                let bf16_cache = counted_steps::<bf16, f32>(level, len, &options, 3, &allocations);
                let ctx = format!("{level} {what}");
                assert!(inline_or_shared(&bf16_cache, items), "{ctx}, f32 queries over bf16: {bf16_cache:?}");
                let int8_cache = counted_steps::<Q8, f32>(level, len, &options, 3, &allocations);
                assert!(inline_or_shared(&int8_cache, items), "{ctx}, f32 queries over int8: {int8_cache:?}");
                // A bf16 output is rounded as each row is stored: no buffer of its own.
                let bf16_out = counted_steps::<bf16, bf16>(level, len, &options, 3, &allocations);
                assert!(inline_or_shared(&bf16_out, items), "{ctx}, bf16 cache into bf16: {bf16_out:?}");
            }
        }
    }
}

/// A windowed cache (a ring of 300 slots, window 300) long past its capacity: each decoding
/// step appends a position, overwriting the oldest, and attends over the two runs of slots the
/// wrap point leaves; after a first such step none allocates, with every option (a keep mask
/// over the 300 positions held included), at every level.
#[test]
fn a_warm_decoding_step_over_a_ring_allocates_nothing() {
    let slopes = qkv::alibi_slopes::<f32>(QUERY_HEADS);
    let keep = every_third_hidden(300);
    let capped = CacheOptions::new()
        .sliding_window(SlidingWindow::new(299, 0))
        .logit_softcap(50.0)
        .scale(0.1)
        .keep_mask(keep.view());
    let alibi = CacheOptions::new().alibi(&slopes).keep_mask(keep.view());
    let sinks = vec![0.5_f32; QUERY_HEADS];
    let with_sinks = CacheOptions::new().alibi(&slopes).sinks(&sinks);
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let ring = SHAPE.with_capacity(300);
    for level in levels() {
        // (what, options, sink tokens, window): the sink tokens and the window fill the 300 slots.
        for (what, options, sink_tokens, window) in [
            ("plain", CacheOptions::new(), 0, 300),
            ("window + cap + keep", capped.clone(), 0, 300),
            ("alibi + keep", alibi.clone(), 0, 300),
            ("sink tokens + alibi + sinks", with_sinks.clone(), 4, 296),
        ] {
            let counts = one_thread.install(|| {
                let cache = KvCache::<bf16>::with_window_for_level(ring, window, level).unwrap();
                let mut cache = cache.with_sink_tokens(sink_tokens).unwrap();
                let mut layer = cache.layer(0).unwrap();
                let kv = |n: usize| {
                    Array3::from_shape_fn((SHAPE.kv_heads, n, 128), |(h, i, c)| {
                        bf16::from_f32(((h + i * c) % 7) as f32 / 7.0)
                    })
                };
                let (prompt, token) = (kv(400), kv(1));
                layer.append(prompt.view(), prompt.view()).unwrap();
                let q = Array3::from_shape_fn((QUERY_HEADS, 1, 128), |(h, _, c)| ((h * c) % 5) as f32 / 5.0);
                let (mut out, mut lse) =
                    (Array3::<f32>::zeros((QUERY_HEADS, 1, 128)), Array2::zeros((QUERY_HEADS, 1)));
                let mut step = || {
                    let before = allocations();
                    layer.append(token.view(), token.view()).unwrap();
                    layer.attend_with_into(q.view(), &options, out.view_mut(), Some(lse.view_mut())).unwrap();
                    allocations() - before
                };
                step();
                [step(), step(), step()]
            });
            assert_eq!(counts, [0, 0, 0], "{level} {what}: a ring's decoding steps, one thread");
        }
    }
}

/// A step worth sharing with rayon's pool, called from a thread of the pool (inside
/// `ThreadPool::install`, as a serving loop runs), hands the helper its share through
/// `rayon::join`, whose job lives on the stack: nothing is allocated on the calling thread, and
/// nothing on the helper (its scratch is kept in the cache, as the caller's is), whose own count
/// is read on its thread. Called from outside the pool, rayon's `Scope::spawn` boxes one job per
/// helper: the one allocation such a step makes.
#[test]
fn a_shared_step_allocates_nothing_inside_the_pool_and_one_job_outside() {
    let two_threads = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    for level in levels() {
        for len in [1500, 2000] {
            let (counts, helper) = two_threads.install(|| {
                let me = rayon::current_thread_index().expect("inside the pool");
                let helper = || two_threads.broadcast(|_| allocations())[1 - me];
                let counts = step_allocations(level, len, &CacheOptions::new(), 3);
                (counts, counted_steps::<f32, f32>(level, len, &CacheOptions::new(), 3, &helper))
            });
            assert_eq!(counts, [0, 0, 0], "{level} {len}: the calling thread, inside the pool");
            assert_eq!(helper, [0, 0, 0], "{level} {len}: the helper");
        }
    }
    if rayon::current_num_threads() > 1 {
        for level in levels() {
            // 2000 positions are one key split: one item per key/value head, shared unless a
            // helper was kept off its CPU lately (tests run beside this one), which keeps small
            // work home for a while. So the steps run again until one shares.
            let some_shared = |counts: &Vec<u64>| counts.iter().any(|&n| n > 0);
            let mut tries = Vec::new();
            while tries.len() < 20 && !tries.last().is_some_and(some_shared) {
                if !tries.is_empty() {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                tries.push(step_allocations(level, 2000, &CacheOptions::new(), 3));
            }
            assert!(
                tries.last().is_some_and(some_shared)
                    && tries.iter().all(|c| inline_or_shared(c, SHAPE.kv_heads)),
                "{level}, outside the pool: {tries:?}"
            );
        }
    }
}

/// Whether `counts` are those of steps over `items` work items called from outside the pool:
/// none for a step that ran on the calling thread; for one that followed the step before closely
/// enough to be shared (`work::worth_sharing`), the job rayon boxes for each helper, and at
/// times one more: the pool's injector queue (crossbeam-deque's `Injector`) takes a new block
/// for every 63 jobs pushed, by whichever thread pushes the first job past the last block.
fn inline_or_shared(counts: &[u64], items: usize) -> bool {
    let helpers = rayon::current_num_threads().min(items) as u64 - 1;
    counts.iter().all(|&n| n == 0 || n == helpers || n == helpers + 1)
}

/// The allocations of each of `steps` batched decoding steps over a paged cache of `E` at
/// `level` (blocks of 64 positions) whose sequences first hold `lengths` positions, into an
/// output of `O`: each step appends every sequence's new position, then attends with one query
/// per sequence in one call (with `options`' options and the logsumexp), after a first such step
/// of the batch.
fn paged_steps<E: CacheStorage, O: Storage>(
    level: SimdLevel,
    lengths: &[usize],
    steps: usize,
    options: Options,
) -> Vec<u64> {
    let block_size = 64;
    let blocks = lengths.iter().map(|len| (len + steps + 1).div_ceil(block_size)).sum();
    let CacheShape { kv_heads, key_dim, value_dim, .. } = SHAPE;
    let shape = PagedShape::new(1, kv_heads, key_dim, value_dim, block_size, blocks);
    let mut cache = PagedKvCache::<E>::for_level(shape, level).unwrap();
    let sequences: Vec<_> = lengths.iter().map(|_| cache.add_sequence()).collect();
    let kv = |n: usize| {
        Array3::from_shape_fn((kv_heads, n, key_dim), |(h, i, c)| {
            E::Appended::from_f32(((h + i * c) % 7) as f32 / 7.0)
        })
    };
    let mut layer = cache.layer(0).unwrap();
    for (&seq, &len) in sequences.iter().zip(lengths) {
        let prompt = kv(len);
        layer.append(seq, prompt.view(), prompt.view()).unwrap();
    }
    let token = kv(1);
    let q = Array3::from_shape_fn((QUERY_HEADS, lengths.len(), key_dim), |(h, j, c)| {
        E::Appended::from_f32(((h * c + j) % 5) as f32 / 5.0)
    });
    let offsets: Vec<usize> = (0..=lengths.len()).collect();
    let mut out = Array3::from_elem((QUERY_HEADS, lengths.len(), value_dim), O::from_f32(0.0));
    let mut lse = Array2::zeros((QUERY_HEADS, lengths.len()));
    let slopes = qkv::alibi_slopes::<f32>(QUERY_HEADS);
    // Each step's keep mask, made beforehand: one column more every step.
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let keeps: Vec<Array2<bool>> = (1..=steps + 1)
        .map(|s| Array2::from_shape_fn((lengths.len(), longest + s), |(i, j)| (i + j) % 3 != 1))
        .collect();
    let mut step = |s: usize| {
        let options = options.with(&slopes, keeps[s].view());
        let before = allocations();
        for &seq in &sequences {
            layer.append(seq, token.view(), token.view()).unwrap();
        }
        layer
            .attend_with_into(&sequences, &offsets, q.view(), &options, out.view_mut(), Some(lse.view_mut()))
            .unwrap();
        allocations() - before
    };
    step(0);
    (1..=steps).map(&mut step).collect()
}

/// The options of [`paged_steps`].
#[derive(Clone, Copy, Debug)]
enum Options {
    Plain,
    /// A sliding window and a soft-cap, then with a keep mask.
    WindowCap,
    WindowCapKeep,
    /// ALiBi (a problem per query head), then with a keep mask.
    Alibi,
    AlibiKeep,
}

impl Options {
    fn with<'a>(self, slopes: &'a [f32], keep: ArrayView2<'a, bool>) -> CacheOptions<'a> {
        let window = || CacheOptions::new().sliding_window(SlidingWindow::new(300, 0)).logit_softcap(50.0);
        match self {
            Options::Plain => CacheOptions::new(),
            Options::WindowCap => window(),
            Options::WindowCapKeep => window().keep_mask(keep),
            Options::Alibi => CacheOptions::new().alibi(slopes),
            Options::AlibiKeep => CacheOptions::new().alibi(slopes).keep_mask(keep),
        }
    }
}

/// A batch of ragged sequences decoding over a paged cache: after a first step of the batch,
/// no step allocates (appends that take a new block included), at every level, for f32, bf16
/// and int8 caches, on a pool of one thread, for a short step from outside the pool (none, or one
/// boxed job per helper when it is shared), and on the calling thread of a step shared inside a
/// pool of two, with every option of the cached path.
#[test]
fn a_warm_batched_decoding_step_over_a_paged_cache_allocates_nothing() {
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let two_threads = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    // One position; 62, whose steps cross into a second block; 200; and 2100, whose keys are
    // split into parts merged at the end (worth sharing, so run on the one-thread pool).
    let (short, long) = ([1, 62, 200].as_slice(), [1, 62, 200, 2100].as_slice());
    for level in levels() {
        let f32_cache = one_thread.install(|| paged_steps::<f32, f32>(level, long, 3, Options::Plain));
        assert_eq!(f32_cache, [0, 0, 0], "{level}: {long:?} positions, one thread");
        let bf16_cache =
            one_thread.install(|| paged_steps::<bf16, bf16>(level, long, 3, Options::WindowCapKeep));
        assert_eq!(
            bf16_cache,
            [0, 0, 0],
            "{level}: {long:?} positions of bf16, window + cap + keep, one thread"
        );
        let shared = two_threads.install(|| paged_steps::<f32, f32>(level, long, 3, Options::Alibi));
        assert_eq!(
            shared,
            [0, 0, 0],
            "{level}: {long:?} positions, ALiBi, the calling thread inside a pool of two"
        );
        // Short steps from outside the pool: on the calling thread, or shared when they follow
        // the last closely; an item per sequence and key/value head.
        let items = short.len() * SHAPE.kv_heads;
        for options in [Options::Plain, Options::WindowCap, Options::AlibiKeep] {
            let steps = paged_steps::<f32, f32>(level, short, 3, options);
            assert!(inline_or_shared(&steps, items), "{level} {options:?}: {short:?} positions: {steps:?}");
        }
        let bf16_cache = paged_steps::<bf16, f32>(level, short, 3, Options::WindowCap);
        assert!(inline_or_shared(&bf16_cache, items), "{level}: {short:?} of bf16 into f32: {bf16_cache:?}");
        let bf16_out = paged_steps::<bf16, bf16>(level, short, 3, Options::AlibiKeep);
        assert!(inline_or_shared(&bf16_out, items), "{level}: {short:?} of bf16 into bf16: {bf16_out:?}");
        let int8_cache = paged_steps::<Q8, f32>(level, short, 3, Options::AlibiKeep);
        assert!(inline_or_shared(&int8_cache, items), "{level}: {short:?} of int8 into f32: {int8_cache:?}");
    }
}

/// A warm backward keeps its working memory on the calling thread: after a first call, a call of
/// the same shape (1024 queries and keys, d = 128: its packed operands and parts of `dq` are
/// 512 KiB each) allocates no large block there, at every level, on a pool of one thread and
/// shared with the default pool, and for multi-head grouped queries.
#[test]
fn a_warm_backward_allocates_no_large_buffer() {
    let large = || LARGE_ALLOCATIONS.with(Cell::get);
    let (n, d) = (1024, 128);
    let x = |seed: usize| {
        Array2::from_shape_fn((n, d), |(i, c)| ((i * 7 + c * 3 + seed) % 11) as f32 / 11.0 - 0.5)
    };
    let (q, k, v) = (x(0), x(1), x(2));
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for level in levels() {
        let options = AttentionOptions::new().simd(level);
        let forward = qkv::attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        let (mut dq, mut dk, mut dv) = (Array2::zeros((n, d)), Array2::zeros((n, d)), Array2::zeros((n, d)));
        let mut call = || {
            let before = large();
            let into = GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
            qkv::attention_backward_into(q.view(), k.view(), v.view(), &forward, v.view(), &options, into)
                .unwrap();
            large() - before
        };
        let shared = [call(), call(), call()];
        assert_eq!(shared[1..], [0, 0], "{level}, shared: {shared:?} large allocations");
        let fresh = std::thread::scope(|scope| scope.spawn(&mut call).join().unwrap());
        assert!(fresh > 0, "{level}: a new thread's first call allocates its buffers");
        // The pool's thread keeps its own buffers: its first call allocates them.
        let alone = one_thread.install(|| [call(), call(), call()]);
        assert_eq!(alone[1..], [0, 0], "{level}, one thread: {alone:?}");
    }
    // Eight query heads over two key/value heads of 256 positions, d = 64.
    let x = |seed: usize, heads: usize| {
        Array4::from_shape_fn((1, heads, 256, 64), |(_, h, i, c)| {
            ((h + i * 5 + c * 3 + seed) % 13) as f32 / 13.0 - 0.5
        })
    };
    let (q, k, v) = (x(0, 8), x(1, 2), x(2, 2));
    for level in levels() {
        let options = AttentionOptions::new().simd(level);
        let forward = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        let d_output = forward.output.clone();
        let (mut dq, mut dk, mut dv) =
            (Array4::zeros(q.raw_dim()), Array4::zeros(k.raw_dim()), Array4::zeros(v.raw_dim()));
        let mut call = || {
            let before = large();
            let into = GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
            let d_output = d_output.view();
            qkv::multi_head_attention_backward_into(
                q.view(),
                k.view(),
                v.view(),
                &forward,
                d_output,
                &options,
                into,
            )
            .unwrap();
            large() - before
        };
        call();
        assert_eq!([call(), call()], [0, 0], "{level}, grouped query heads");
    }
}

/// A warm half-precision backward widens its bf16 inputs as it packs them: after a first call, a
/// call at 1024 queries and keys, d = 128, allocates three large blocks on the calling thread,
/// its f32 gradients `dq`, `dk` and `dv` (512 KiB each), and no widened copy of an input, at
/// every level.
#[test]
fn a_warm_half_precision_backward_allocates_only_its_gradients() {
    let large = || LARGE_ALLOCATIONS.with(Cell::get);
    let (n, d) = (1024, 128);
    let x = |seed: usize| {
        Array2::from_shape_fn((n, d), |(i, c)| {
            bf16::from_f32(((i * 7 + c * 3 + seed) % 11) as f32 / 11.0 - 0.5)
        })
    };
    let (q, k, v) = (x(0), x(1), x(2));
    for level in levels() {
        let options = AttentionOptions::new().simd(level);
        let forward = qkv::attention_half_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        let call = || {
            let before = large();
            let gradients =
                qkv::attention_backward_half(q.view(), k.view(), v.view(), &forward, v.view(), &options)
                    .unwrap();
            let after = large();
            drop(gradients);
            after - before
        };
        let counts = [call(), call(), call()];
        assert_eq!(counts[1..], [3, 3], "{level}: {counts:?} large allocations");
    }
}
