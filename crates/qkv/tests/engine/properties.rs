//! Properties attention has whatever the inputs: checked on the reference and the fast paths.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ndarray::{Array2, s};
use proptest::prelude::*;
use qkv::{AdditiveBias, AttentionOptions, CausalMask};

use crate::problem::{MASK_KINDS, MaskKind, Problem, levels};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn weights_are_distributions_and_outputs_are_blends(
        seed in any::<u64>(), n_q in 1usize..40, n_k in 1usize..40, d in 1usize..9, mask in 0usize..MASK_KINDS.len(),
    ) {
        let p = Problem::<f64>::random(seed, (n_q, n_k, d, d), 3.0, MASK_KINDS[mask]);
        let r = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &p.options()).unwrap();
        for (i, row) in r.weights.rows().into_iter().enumerate() {
            let sum: f64 = row.sum();
            prop_assert!(row.iter().all(|a| (0.0..=1.0).contains(a)));
            // A row whose keys are all hidden is all zero and its output is zero; otherwise it sums to 1.
            if sum == 0.0 {
                prop_assert!(r.output.row(i).iter().all(|o| *o == 0.0));
                continue;
            }
            prop_assert!((sum - 1.0).abs() < 1e-12, "row {i} sums to {sum}");
            // Each output component lies between the min and max of the values it blends.
            for c in 0..d {
                let blended = row.iter().zip(p.v.column(c)).filter(|(a, _)| **a > 0.0).map(|(_, x)| *x);
                let (lo, hi) = blended.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| (l.min(x), h.max(x)));
                let o = r.output[[i, c]];
                prop_assert!(o >= lo - 1e-12 && o <= hi + 1e-12, "output {o} outside [{lo}, {hi}]");
            }
        }
    }

    #[test]
    fn permuting_keys_with_values_changes_nothing(seed in any::<u64>(), n_k in 2usize..30, shift in 1usize..29) {
        let p = Problem::<f64>::random(seed, (5, n_k, 4, 3), 2.0, MaskKind::None);
        let order: Vec<usize> = (0..n_k).map(|j| (j + shift) % n_k).collect();
        let k2 = p.k.select(ndarray::Axis(0), &order);
        let v2 = p.v.select(ndarray::Axis(0), &order);
        let a = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &AttentionOptions::new()).unwrap();
        let b = qkv::attention(p.q.view(), k2.view(), v2.view(), &AttentionOptions::new()).unwrap();
        prop_assert!(a.iter().zip(b.iter()).all(|(x, y)| (x - y).abs() < 1e-12));
    }

    #[test]
    fn adding_a_constant_to_every_score_keeps_the_weights(seed in any::<u64>(), c in -50.0f64..50.0) {
        let p = Problem::<f64>::random(seed, (6, 11, 3, 2), 2.0, MaskKind::None);
        let shift = Array2::from_elem((6, 11), c);
        let plain = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &AttentionOptions::new()).unwrap();
        let opts = AttentionOptions::new().bias(AdditiveBias::new(shift.view()));
        let shifted = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &opts).unwrap();
        prop_assert!(plain.weights.iter().zip(shifted.weights.iter()).all(|(x, y)| (x - y).abs() < 1e-12));
    }

    #[test]
    fn causal_first_query_returns_first_value(seed in any::<u64>(), n in 1usize..50, d_v in 1usize..6) {
        let p = Problem::<f32>::random(seed, (n, n, 4, d_v), 5.0, MaskKind::None);
        let opts = AttentionOptions::new().causal(CausalMask::TopLeft);
        let out = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &opts).unwrap();
        prop_assert_eq!(out.row(0), p.v.row(0));
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    for mask in MASK_KINDS {
        let p = Problem::<f32>::random(3, (300, 257, 16, 8), 2.0, mask);
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &p.options()).unwrap()
            })
        };
        let (one, two, three) = (run(1), run(2), run(3));
        assert!(one == two && two == three, "{mask:?}: results differ between 1, 2 and 3 threads");
    }
}

#[test]
fn fast_path_results_do_not_depend_on_thread_count() {
    // Output only (the tiled path) at every SIMD level, including decoding shapes whose keys are
    // split across tasks.
    for level in levels() {
        for mask in MASK_KINDS {
            for dims in [
                (300, 257, 16, 8),
                (1, 5000, 32, 16),
                (65, 3000, 8, 8),
                (256, 256, 64, 64),
                (200, 300, 64, 64),
            ] {
                let p = Problem::<f32>::random(3, dims, 2.0, mask);
                let options = p.options().simd(level);
                let run = |threads| {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    pool.install(|| qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap())
                };
                let (one, two, three) = (run(1), run(2), run(3));
                assert!(
                    one == two && two == three,
                    "{level} {mask:?} {dims:?}: results differ between 1, 2 and 3 threads"
                );
            }
        }
    }
}

#[test]
fn multi_head_results_do_not_depend_on_how_heads_are_shared_out() {
    // 2 × 20 query heads over 5 key/value heads: one, two and three threads take each head's
    // query blocks as one work item but for the last head per thread, which is cut into blocks;
    // twelve threads (fewer than 4 heads each) take every block on its own.
    let value = |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 1999) as f32 / 999.5 - 1.0;
    let tensor = |heads, n, d, salt| {
        ndarray::Array4::from_shape_fn((2, heads, n, d), |(b, h, i, c)| {
            value(((b * 31 + h) * 97 + i) * 13 + c, salt)
        })
    };
    let (q, k, v) = (tensor(20, 130, 24, 1), tensor(5, 150, 24, 2), tensor(5, 150, 16, 3));
    for level in levels() {
        for causal in [false, true] {
            let options = AttentionOptions::new().simd(level);
            let options = if causal { options.causal(CausalMask::BottomRight) } else { options };
            let run = |threads| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| qkv::multi_head_attention(q.view(), k.view(), v.view(), &options).unwrap())
            };
            let (one, two, three, twelve) = (run(1), run(2), run(3), run(12));
            assert!(
                one == two && two == three && three == twelve,
                "{level} causal {causal}: results differ between 1, 2, 3 and 12 threads"
            );
        }
    }
}

/// A [`qkv::ThreadTeam`] that spawns its threads for each call (or, `one_by_one`, runs `work` on
/// the calling thread as many times) and counts its calls.
struct SpawnedTeam {
    threads: usize,
    one_by_one: bool,
    runs: AtomicUsize,
}

impl qkv::ThreadTeam for SpawnedTeam {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, threads: usize, work: &(dyn Fn() + Sync)) {
        assert!((2..=self.threads).contains(&threads), "asked for {threads} of {} threads", self.threads);
        self.runs.fetch_add(1, Ordering::Relaxed);
        if self.one_by_one {
            (0..threads).for_each(|_| work());
            return;
        }
        std::thread::scope(|scope| {
            for _ in 1..threads {
                scope.spawn(work);
            }
            work();
        });
    }
}

/// Runs `call` until `team` has taken part in one: a call keeps small work on its calling thread
/// for a while after a team's thread started late (as spawned threads may under the tests' load),
/// and shares again once that while has passed (at most 160 ms after the last late start).
fn until_the_team_takes_part(team: &SpawnedTeam, call: impl Fn()) {
    let start = std::time::Instant::now();
    call();
    while team.runs.load(Ordering::Relaxed) == 0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "the team took no part");
        std::thread::sleep(std::time::Duration::from_millis(20));
        call();
    }
}

#[test]
fn results_are_the_same_on_another_librarys_threads() {
    // Large enough to share: a prefill, a decoding step split over its keys, and a multi-head
    // decoding step whose key/value heads interleave (token-major keys, taken in turn).
    let heads = |n, heads, salt| {
        ndarray::Array4::from_shape_fn((2, n, heads, 32), |(b, i, h, c)| {
            (((b * 31 + h) * 97 + i) * 13 + c + salt) as f32 % 17.0 / 8.5 - 1.0
        })
    };
    let (mq, mk, mv) = (heads(1, 16, 1), heads(6000, 8, 2), heads(6000, 8, 3));
    let (mq, mk, mv) =
        (mq.permuted_axes([0, 2, 1, 3]), mk.permuted_axes([0, 2, 1, 3]), mv.permuted_axes([0, 2, 1, 3]));
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for level in levels() {
        for (dims, mask) in [
            ((600, 700, 64, 48), MaskKind::None),
            ((600, 700, 64, 48), MaskKind::CausalTopLeft),
            ((1, 40000, 64, 64), MaskKind::None),
        ] {
            let p = Problem::<f32>::random(5, dims, 2.0, mask);
            let options = p.options().simd(level);
            let call = || qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            let alone = one_thread.install(call);
            for (threads, one_by_one) in [(2, false), (3, false), (3, true)] {
                let team = Arc::new(SpawnedTeam { threads, one_by_one, runs: AtomicUsize::new(0) });
                until_the_team_takes_part(&team, || {
                    let on_team = qkv::with_thread_team(team.clone(), call);
                    assert!(
                        alone == on_team,
                        "{level} {dims:?} {mask:?}: {threads} threads, one by one {one_by_one}"
                    );
                });
            }
        }
        let options = AttentionOptions::new().simd(level);
        let call = || qkv::multi_head_attention(mq.view(), mk.view(), mv.view(), &options).unwrap();
        let alone = one_thread.install(call);
        let team = Arc::new(SpawnedTeam { threads: 2, one_by_one: false, runs: AtomicUsize::new(0) });
        until_the_team_takes_part(&team, || {
            assert!(alone == qkv::with_thread_team(team.clone(), call), "{level}: multi-head decoding");
        });
    }
}

/// A [`qkv::ThreadTeam`] that claims `claimed` threads and runs `work` on two.
struct Claiming {
    claimed: usize,
}

impl qkv::ThreadTeam for Claiming {
    fn threads(&self) -> usize {
        self.claimed
    }

    fn run(&self, _threads: usize, work: &(dyn Fn() + Sync)) {
        std::thread::scope(|scope| {
            scope.spawn(work);
            work();
        });
    }
}

#[test]
fn a_team_claiming_any_number_of_threads_gets_the_same_results() {
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for dims in [(600, 700, 64, 48), (1, 40000, 64, 64), (0, 5, 8, 8), (3, 0, 8, 8)] {
        let p = Problem::<f32>::random(9, dims, 2.0, MaskKind::CausalBottomRight);
        let options = p.options();
        let call = || qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options);
        let alone = one_thread.install(call).unwrap();
        for claimed in [0, 1, 2, 5000, usize::MAX] {
            let on_team = qkv::with_thread_team(Arc::new(Claiming { claimed }), call).unwrap();
            assert!(alone == on_team, "{dims:?}: a team claiming {claimed} threads");
        }
        // The weights' path too.
        let weights = |_| qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        let alone = one_thread.install(|| weights(()));
        let on_team = qkv::with_thread_team(Arc::new(Claiming { claimed: usize::MAX }), || weights(()));
        assert!(alone.output == on_team.output && alone.weights == on_team.weights, "{dims:?}: weights");
    }
}

#[test]
fn huge_scores_give_finite_results() {
    let q = ndarray::array![[100.0_f32, -100.0], [-100.0, 100.0]];
    let k = ndarray::array![[100.0_f32, 0.0], [0.0, 100.0], [-100.0, -100.0]];
    let v = ndarray::array![[1.0_f32], [2.0], [3.0]];
    // Scores reach ±1e4 / sqrt(2): exp without the max shift would overflow f32.
    let out = qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
    assert_eq!(out.slice(s![.., 0]).to_vec(), vec![1.0, 2.0]);
}

#[test]
fn every_key_hidden_gives_zero_output_never_nan() {
    let q = ndarray::array![[1.0_f64, 2.0]];
    let k = ndarray::array![[1.0, 0.0], [0.0, 1.0]];
    let v = ndarray::array![[5.0, 6.0], [7.0, 8.0]];
    let padding = ndarray::array![false, false];
    let opts = AttentionOptions::new().key_padding(qkv::KeyPadding::new(padding.view()));
    let r = qkv::attention_with_weights(q.view(), k.view(), v.view(), &opts).unwrap();
    assert_eq!(r.output, ndarray::array![[0.0, 0.0]]);
    assert_eq!(*r.weights, ndarray::array![[0.0, 0.0]]);
    let t = qkv::trace_query(q.view(), k.view(), v.view(), 0, &opts).unwrap();
    assert_eq!((t.max, t.sum, t.output), (None, 0.0, vec![0.0, 0.0]));
}

#[test]
fn causal_alignments_when_queries_are_fewer_than_keys() {
    // Two queries over four keys: bottom-right treats them as positions 2 and 3; top-left as 0 and 1.
    let q = Array2::<f64>::zeros((2, 1));
    let k = Array2::<f64>::zeros((4, 1));
    let v = ndarray::array![[1.0], [2.0], [3.0], [4.0]];
    let visible = |mask| {
        let r =
            qkv::attention_with_weights(q.view(), k.view(), v.view(), &AttentionOptions::new().causal(mask))
                .unwrap();
        r.weights.mapv(|w| u8::from(w > 0.0))
    };
    assert_eq!(visible(CausalMask::BottomRight), ndarray::array![[1, 1, 1, 0], [1, 1, 1, 1]]);
    assert_eq!(visible(CausalMask::TopLeft), ndarray::array![[1, 0, 0, 0], [1, 1, 0, 0]]);
}

#[test]
fn keep_mask_padding_and_bias_hide_exactly_their_pairs() {
    let q = Array2::<f64>::zeros((2, 1));
    let k = Array2::<f64>::zeros((3, 1));
    let v = ndarray::array![[1.0], [2.0], [3.0]];
    let keep = ndarray::array![[true, false, true], [true, true, true]];
    let padding = ndarray::array![true, true, false];
    let bias = ndarray::array![[0.0, f64::NEG_INFINITY, 0.0], [0.0, 0.0, 0.0]];
    let opts = AttentionOptions::new()
        .keep_mask(qkv::KeepMask::new(keep.view()))
        .key_padding(qkv::KeyPadding::new(padding.view()))
        .bias(AdditiveBias::new(bias.view()));
    let r = qkv::attention_with_weights(q.view(), k.view(), v.view(), &opts).unwrap();
    assert_eq!(*r.weights, ndarray::array![[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]);
    assert_eq!(r.output, ndarray::array![[1.0], [1.5]]);
}
