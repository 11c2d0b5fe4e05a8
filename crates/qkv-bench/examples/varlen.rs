//! Runs one packed batch of sequences of different lengths many times through `varlen_attention`,
//! or with `--per-sequence` through `multi_head_attention` on each sequence's slice of the same
//! tensors, for profilers and `python/repeat_ab.py`: `varlen [--per-sequence] [--flash-layout]
//! [--beside-spinner] BATCH REPS`. With `--flash-layout` the tensors are stored as flash-attn's
//! `[total, heads, d]` and passed as views of them, as the Python package passes them, rather than
//! as `[heads, total, d]`. With `--beside-spinner` another thread spins all the while, as an
//! OpenMP runtime's threads spin between PyTorch's operations, so that one CPU is busy.
//!
//! Every batch has 8 query heads over 2 key/value heads, d = 64, causal (bottom-right). Queries
//! and keys per sequence: `prefill8`, eight prefills of 114 to 866 tokens; `short32`, 32
//! prefills of 20 to 119 tokens; `chunked`, a chunk of 512 queries over 1536 keys beside 16
//! decoding steps over 500 to 2000 keys; `few12`, 32 sequences of 12 queries over 200 to 1999
//! keys (one query block of stacked rows each); `decode64`, 64 decoding steps over 200 to 1999
//! keys.

use std::sync::atomic::{AtomicBool, Ordering};

use ndarray::{Array3, Axis, s};
use qkv::{AttentionOptions, CausalMask};

/// The command line, as `--help` prints it.
const USAGE: &str = "usage: varlen [--per-sequence] [--flash-layout] [--beside-spinner] prefill8|short32|chunked|few12|decode64 REPS";

/// Says what was wrong with the command line, and how it goes, and exits with status 2.
fn usage_error(what: &str) -> ! {
    eprintln!("varlen: {what}\n{USAGE}");
    std::process::exit(2)
}

/// Queries and keys of each sequence of the batch named `name`.
fn batch(name: &str) -> Vec<(usize, usize)> {
    let spread = |count: usize| (0..count).map(move |i| 200 + (i * 97) % 1800);
    match name {
        "prefill8" => [866, 673, 560, 343, 377, 136, 167, 114].map(|n| (n, n)).to_vec(),
        "short32" => (0..32).map(|i| 20 + (i * 37) % 100).map(|n| (n, n)).collect(),
        "chunked" => std::iter::once((512, 1536)).chain((0..16).map(|i| (1, 500 + 100 * i))).collect(),
        "few12" => spread(32).map(|n| (12, n)).collect(),
        "decode64" => spread(64).map(|n| (1, n)).collect(),
        _ => usage_error(&format!("no batch named {name:?}")),
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let mut flag = |name: &str| {
        let given = args.iter().position(|a| a == name);
        given.map(|at| args.remove(at)).is_some()
    };
    let (per_sequence, flash_layout) = (flag("--per-sequence"), flag("--flash-layout"));
    let beside_spinner = flag("--beside-spinner");
    let [name, reps] = args.as_slice() else { usage_error("BATCH and REPS are needed") };
    let reps: usize =
        reps.parse().unwrap_or_else(|_| usage_error(&format!("{reps:?} is not a whole number")));
    let lengths = batch(name);
    let offsets = |pick: fn(&(usize, usize)) -> usize| {
        let mut offsets = vec![0];
        for l in &lengths {
            offsets.push(offsets.last().expect("starts at 0") + pick(l));
        }
        offsets
    };
    let (query_offsets, key_offsets) = (offsets(|l| l.0), offsets(|l| l.1));
    let (total_q, total_k) = (query_offsets[lengths.len()], key_offsets[lengths.len()]);
    let (heads, kv_heads, d) = (8, 2, 64);
    let value = |(h, i, j): (usize, usize, usize), salt: usize| {
        (((h * 7 + i * 31 + j * 17 + salt) % 29) as f32 - 14.0) / 14.0
    };
    // Element (h, i, j) holds the same value in either layout.
    let tensor = |heads: usize, total: usize, salt: usize| {
        if flash_layout {
            let flash = Array3::from_shape_fn((total, heads, d), |(i, h, j)| value((h, i, j), salt));
            flash.permuted_axes([1, 0, 2])
        } else {
            Array3::from_shape_fn((heads, total, d), |at| value(at, salt))
        }
    };
    let (q, k, v) = (tensor(heads, total_q, 1), tensor(kv_heads, total_k, 2), tensor(kv_heads, total_k, 3));
    let options = AttentionOptions::new().causal(CausalMask::BottomRight);
    let done = AtomicBool::new(false);
    std::thread::scope(|threads| {
        if beside_spinner {
            threads.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        run(reps, per_sequence, &lengths, (&query_offsets, &key_offsets), (&q, &k, &v), &options);
        done.store(true, Ordering::Relaxed);
    });
}

/// Runs the batch `reps` times and says how long that took.
fn run(
    reps: usize,
    per_sequence: bool,
    lengths: &[(usize, usize)],
    (query_offsets, key_offsets): (&[usize], &[usize]),
    (q, k, v): (&Array3<f32>, &Array3<f32>, &Array3<f32>),
    options: &AttentionOptions<f32>,
) {
    let start = std::time::Instant::now();
    for _ in 0..reps {
        if per_sequence {
            for (qs, ks) in query_offsets.windows(2).zip(key_offsets.windows(2)) {
                let (queries, keys) = (s![.., qs[0]..qs[1], ..], s![.., ks[0]..ks[1], ..]);
                let (qs, ks, vs) = (q.slice(queries), k.slice(keys), v.slice(keys));
                let (qs, ks, vs) =
                    (qs.insert_axis(Axis(0)), ks.insert_axis(Axis(0)), vs.insert_axis(Axis(0)));
                let out = qkv::multi_head_attention(qs, ks, vs, options);
                std::hint::black_box(out.expect("valid"));
            }
        } else {
            let out =
                qkv::varlen_attention(q.view(), k.view(), v.view(), query_offsets, key_offsets, options);
            std::hint::black_box(out.expect("valid"));
        }
    }
    println!("{reps} calls over {} sequences in {:.3} s", lengths.len(), start.elapsed().as_secs_f64());
}
