//! The fixture's positions block against independent computations: RoPE as multiplication by
//! unit complex numbers (each pair a complex number, turned by `e^{i m θ}`), attention over the
//! rotated inputs by the engine's fast path, the sinusoids from their formula, and the sweep's
//! scores all equal for a fixed distance.

use ndarray::Array2;

use super::{EVERY_KIND, one_file, values_of};

/// `x` rotated for position `m`: pair `i` as the complex number `x_2i + i x_2i+1`, times
/// `e^{i m θ_i}`, `θ_i = base^(-2i/d)`.
fn by_complex(x: &[f64], m: f64, base: f64) -> Vec<f64> {
    let d = x.len() as f64;
    x.chunks(2)
        .enumerate()
        .flat_map(|(i, pair)| {
            let turn = m * base.powf(-((2 * i) as f64) / d);
            let (re, im) = (turn.cos(), turn.sin());
            [pair[0] * re - pair[1] * im, pair[0] * im + pair[1] * re]
        })
        .collect()
}

#[test]
fn rope_and_sinusoids_equal_an_independent_computation() {
    let values = values_of(&one_file(EVERY_KIND));
    let get = |path: &str| *values.get(&format!("test.rot.{path}")).unwrap_or_else(|| panic!("no {path}"));
    let base = 100.0;
    let q = [[1., 0., 2., -1.], [0., 1., -1., 0.5], [1., 1., 0.5, 0.]];
    let k = [[0.5, 1., 0., -1.], [1., 0., 1., 1.], [-1., 2., 0., 0.5]];
    let v = Array2::from_shape_vec((3, 2), vec![2., 0., 6., 1., 4., -1.]).expect("3 x 2");
    let rows = |m: &[[f64; 4]; 3]| {
        Array2::from_shape_vec(
            (3, 4),
            m.iter().enumerate().flat_map(|(i, r)| by_complex(r, i as f64, base)).collect(),
        )
        .expect("3 x 4")
    };
    let out = qkv::attention(rows(&q).view(), rows(&k).view(), v.view(), &qkv::AttentionOptions::new())
        .expect("engine");
    let close = |path: &str, expected: f64| {
        let ours = get(path);
        assert!((ours - expected).abs() < 1e-9, "{path}: {ours} vs {expected}");
    };
    for (i, t) in ["a", "b", "c"].iter().enumerate() {
        for c in 0..2 {
            close(&format!("rope.{t}.output.{}", c + 1), out[[i, c]]);
        }
        for c in 0..4 {
            close(&format!("rope.queries.{t}.{}", c + 1), by_complex(&q[i], i as f64, base)[c]);
        }
    }
    // The sweep: "c" at 1 + s, "a" at s; RoPE's score is the same at every point.
    let scale = 0.5;
    for s in 0..4 {
        let (m, n) = ((s + 1) as f64, s as f64);
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let rope = scale * dot(&by_complex(&q[2], m, base), &by_complex(&k[0], n, base));
        close(&format!("sweep.{}.rope_score", s + 1), rope);
        close("sweep.1.rope_score", rope);
        // The sinusoids by their formula: sin and cos of position × base^(-2i/d), pair by pair.
        let pe = |p: f64| -> Vec<f64> {
            (0..2)
                .flat_map(|i| {
                    [
                        (p * base.powf(-((2 * i) as f64) / 4.0)).sin(),
                        (p * base.powf(-((2 * i) as f64) / 4.0)).cos(),
                    ]
                })
                .collect()
        };
        let add = |a: &[f64], b: Vec<f64>| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<_>>();
        close(
            &format!("sweep.{}.sinusoid_score", s + 1),
            scale * dot(&add(&q[2], pe(m)), &add(&k[0], pe(n))),
        );
        if s == 3 {
            close("encoding.3.1", pe(3.0)[0]);
            close("encoding.3.4", pe(3.0)[3]);
        }
    }
    close("theta.2", base.powf(-0.5));
}
