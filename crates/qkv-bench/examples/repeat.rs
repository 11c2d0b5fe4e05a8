//! Runs one attention shape many times, for profilers:
//! `repeat [--pool] [--backward] [--bf16] [--dim D] N_Q N_K MASK REPS [HEADS KV_HEADS]` (with
//! `--pool` the calls are made from a thread of a rayon pool of `RAYON_NUM_THREADS`, as the bench
//! makes them, rather than from outside the pool; with `--backward`
//! each repetition is the backward from a forward run once before the loop; with `--bf16` the
//! forward or the backward takes queries, keys and values (and the output's gradient) rounded to
//! bf16; D is `d_k = d_v`, 64 unless given), MASK 0 = none, 1 = causal, 2 = key padding (the
//! last tenth of the keys), 3 = an additive bias (zeros), 4 = a causal sliding window of 256 keys
//! back (the tiles before it skipped); with HEADS (and KV_HEADS, default HEADS) it runs
//! `multi_head_attention` over that many query heads sharing KV_HEADS key/value heads, batch 1.
//! `valgrind --tool=callgrind` with `RAYON_NUM_THREADS=1` counts its instructions, a figure that
//! other processes on the machine do not disturb the way they disturb wall-clock time.

use ndarray::{Array1, Array2, Array4};
use qkv::{AdditiveBias, AttentionOptions, CausalMask, KeyPadding, SlidingWindow};

/// The command line, as `--help` prints it (the module's documentation says what each part does).
const USAGE: &str =
    "usage: repeat [--pool] [--backward] [--bf16] [--dim D] N_Q N_K MASK(0..=4) REPS [HEADS KV_HEADS]";

/// Says what was wrong with the command line, and how it goes, and exits with status 2.
fn usage_error(what: &str) -> ! {
    eprintln!("repeat: {what}\n{USAGE}");
    std::process::exit(2)
}

/// Removes `name` from the front of `args`; whether it was there.
fn flag(args: &mut Vec<String>, name: &str) -> bool {
    let given = args.first().is_some_and(|a| a == name);
    if given {
        args.remove(0);
    }
    given
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    if flag(&mut args, "--pool") {
        let pool = rayon::ThreadPoolBuilder::new().build().expect("a thread pool");
        pool.install(|| run(args));
    } else {
        run(args);
    }
}

/// The shape and options `args` name, timed.
fn run(mut args: Vec<String>) {
    let backward = flag(&mut args, "--backward");
    let bf16 = flag(&mut args, "--bf16");
    let d = match args.first().map(String::as_str) {
        Some("--dim") => {
            let d = args
                .get(1)
                .and_then(|d| d.parse().ok())
                .unwrap_or_else(|| usage_error("--dim takes a number"));
            args.drain(..2);
            d
        }
        _ => 64,
    };
    let args: Vec<usize> = args
        .iter()
        .map(|a| a.parse().unwrap_or_else(|_| usage_error(&format!("{a:?} is not a whole number"))))
        .collect();
    let (&[n_q, n_k, mask, reps], heads) = args.split_at(4.min(args.len())) else {
        usage_error("N_Q, N_K, MASK and REPS are needed")
    };
    let (heads, kv_heads) = match heads {
        [] => (1, 1),
        [h] => (*h, *h),
        [h, kv, ..] => (*h, *kv),
    };
    let value = |i: usize, j: usize, salt: usize| (((i * 31 + j * 17 + salt) % 29) as f32 - 14.0) / 14.0;
    let m = |rows, salt: usize| Array2::from_shape_fn((rows, d), |(i, j)| value(i, j, salt));
    let (q, k, v) = (m(n_q, 1), m(n_k, 2), m(n_k, 3));
    let padding = Array1::from_shape_fn(n_k, |j| j < n_k - n_k / 10);
    let bias = Array2::<f32>::zeros((n_q, n_k));
    let options = match mask {
        0 => AttentionOptions::new(),
        1 => AttentionOptions::new().causal(CausalMask::BottomRight),
        2 => AttentionOptions::new().key_padding(KeyPadding::new(padding.view())),
        4 => {
            AttentionOptions::new().causal(CausalMask::BottomRight).sliding_window(SlidingWindow::new(256, 0))
        }
        3 => AttentionOptions::new().bias(AdditiveBias::new(bias.view())),
        _ => usage_error(&format!("MASK is 0 to 4, not {mask}")),
    };
    let m4 = |h, rows, salt| Array4::from_shape_fn((1, h, rows, d), |(_, h, i, j)| value(i + h, j, salt));
    let (q4, k4, v4) = (m4(heads, n_q, 1), m4(kv_heads, n_k, 2), m4(kv_heads, n_k, 3));
    // Runs `call` REPS times and prints its FLOPs, `per · n_q · n_k · d` a call for each head
    // (FlashAttention-2's count: the backward is 2.5 forwards), halved under a causal mask. The
    // sliding window's figure counts full attention: compare its time, not its rate.
    let timed = |per: f64, call: &mut dyn FnMut()| {
        let start = std::time::Instant::now();
        (0..reps).for_each(|_| call());
        let flops = per * (heads * n_q * n_k * d) as f64 * reps as f64 / if mask == 1 { 2.0 } else { 1.0 };
        println!("{flops:e} flops in {:.3} s", start.elapsed().as_secs_f64());
    };
    let rounded = |a: &Array2<f32>| a.mapv(half::bf16::from_f32);
    let rounded4 = |a: &Array4<f32>| a.mapv(half::bf16::from_f32);
    if backward && bf16 {
        if heads == 1 {
            let (q, k, v, d_out) = (rounded(&q), rounded(&k), rounded(&v), rounded(&m(n_q, 4)));
            let forward =
                qkv::attention_half_with_lse(q.view(), k.view(), v.view(), &options).expect("valid");
            timed(10.0, &mut || {
                let (q, k, v) = (q.view(), k.view(), v.view());
                let g = qkv::attention_backward_half(q, k, v, &forward, d_out.view(), &options);
                std::hint::black_box(g.expect("valid"));
            });
        } else {
            let (q, k, v, d_out) =
                (rounded4(&q4), rounded4(&k4), rounded4(&v4), rounded4(&m4(heads, n_q, 4)));
            let forward = qkv::multi_head_attention_half_with_lse(q.view(), k.view(), v.view(), &options)
                .expect("valid");
            timed(10.0, &mut || {
                let (q, k, v) = (q.view(), k.view(), v.view());
                let g = qkv::multi_head_attention_backward_half(q, k, v, &forward, d_out.view(), &options);
                std::hint::black_box(g.expect("valid"));
            });
        }
    } else if backward {
        if heads == 1 {
            let d_out = m(n_q, 4);
            let forward = qkv::attention_with_lse(q.view(), k.view(), v.view(), &options).expect("valid");
            timed(10.0, &mut || {
                let (q, k, v) = (q.view(), k.view(), v.view());
                let g = qkv::attention_backward(q, k, v, &forward, d_out.view(), &options);
                std::hint::black_box(g.expect("valid"));
            });
        } else {
            let d_out = m4(heads, n_q, 4);
            let forward =
                qkv::multi_head_attention_with_lse(q4.view(), k4.view(), v4.view(), &options).expect("valid");
            timed(10.0, &mut || {
                let (q, k, v) = (q4.view(), k4.view(), v4.view());
                let g = qkv::multi_head_attention_backward(q, k, v, &forward, d_out.view(), &options);
                std::hint::black_box(g.expect("valid"));
            });
        }
    } else if bf16 && heads == 1 {
        let (q, k, v) = (rounded(&q), rounded(&k), rounded(&v));
        timed(4.0, &mut || {
            let out = qkv::attention_half(q.view(), k.view(), v.view(), &options).expect("valid");
            std::hint::black_box(out);
        });
    } else if bf16 {
        let (q, k, v) = (rounded4(&q4), rounded4(&k4), rounded4(&v4));
        timed(4.0, &mut || {
            let out = qkv::multi_head_attention_half(q.view(), k.view(), v.view(), &options).expect("valid");
            std::hint::black_box(out);
        });
    } else if heads == 1 {
        timed(4.0, &mut || {
            std::hint::black_box(qkv::attention(q.view(), k.view(), v.view(), &options).expect("valid"));
        });
    } else {
        timed(4.0, &mut || {
            let out = qkv::multi_head_attention(q4.view(), k4.view(), v4.view(), &options).expect("valid");
            std::hint::black_box(out);
        });
    }
}
