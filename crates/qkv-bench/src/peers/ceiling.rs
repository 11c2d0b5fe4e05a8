//! The f32 GEMM ceiling: a square product with the `gemm` crate, which picks its kernels for the
//! CPU at run time (its AVX-512 ones, enabled by the `x86-v4` feature, only where the CPU has
//! AVX-512; AVX2+FMA ones otherwise).

use std::time::Instant;

use super::Ceiling;

pub fn measure(quick: bool) -> Ceiling {
    let n = 2048;
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0).collect();
    let mut c = vec![0.0_f32; n * n];
    let threads = rayon::current_num_threads();
    let mut run = || {
        // SAFETY: `a`, `b` and `c` each hold `n · n` elements, laid out row-major (column stride 1,
        // row stride n) as passed, and `c` does not alias the inputs.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(threads),
            );
        }
    };
    run();
    let mut times: Vec<f64> = (0..if quick { 5 } else { 11 })
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ceiling {
        label: format!("gemm crate, {n}x{n}x{n}"),
        gflops: 2.0 * (n * n * n) as f64 / median / 1e9,
        median_ms: median * 1e3,
    }
}
