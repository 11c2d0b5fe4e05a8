//! Seeded Monte Carlo for the scaling figures: a small PRNG of our own (splitmix64 and
//! Box–Muller), so the figures are the same on every machine and need no extra crate.

use ndarray::Array2;

/// splitmix64: tiny, fast, and good enough for sampling figures.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller; one of the pair is enough here).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    fn normals(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.normal()).collect()
    }
}

/// Two series over the same dimensions: without and with the `1/sqrt(d_k)` scale.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pair {
    pub raw: Vec<f64>,
    pub scaled: Vec<f64>,
}

/// Sample variance of `q · k` (and of `q · k / sqrt(d_k)`) for random unit-variance vectors.
pub(crate) fn variance(seed: u64, trials: usize, dims: &[usize]) -> Pair {
    let mut rng = Rng(seed);
    let mut pair = Pair { raw: Vec::new(), scaled: Vec::new() };
    for &d in dims {
        let dots: Vec<f64> = (0..trials)
            .map(|_| {
                let (q, k) = (rng.normals(d), rng.normals(d));
                q.iter().zip(&k).map(|(a, b)| a * b).sum()
            })
            .collect();
        let mean = dots.iter().sum::<f64>() / trials as f64;
        let var = dots.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (trials.max(2) - 1) as f64;
        pair.raw.push(var);
        pair.scaled.push(var / d as f64);
    }
    pair
}

/// Keys per trial in the saturation figure.
pub(crate) const SATURATION_KEYS: usize = 8;

/// Mean of the largest softmax weight of one random query over 8 random keys, with raw scores
/// (scale 1) and with the engine's default `1/sqrt(d_k)`; the softmax is the engine's.
pub(crate) fn saturation(seed: u64, trials: usize, dims: &[usize]) -> Result<Pair, qkv::AttentionError> {
    let mut rng = Rng(seed);
    let trials = (trials / 10).max(1);
    let mut pair = Pair { raw: Vec::new(), scaled: Vec::new() };
    for &d in dims {
        let (mut raw, mut scaled) = (0.0, 0.0);
        for _ in 0..trials {
            let q = Array2::from_shape_vec((1, d), rng.normals(d)).unwrap_or_else(|_| Array2::zeros((1, d)));
            let k = Array2::from_shape_vec((SATURATION_KEYS, d), rng.normals(SATURATION_KEYS * d))
                .unwrap_or_else(|_| Array2::zeros((SATURATION_KEYS, d)));
            let v = Array2::<f64>::zeros((SATURATION_KEYS, 1));
            let largest = |a: &qkv::Attention<f64>| a.weights.iter().copied().fold(0.0, f64::max);
            let unscaled = qkv::AttentionOptions::new().scale(1.0);
            raw += largest(&qkv::attention_with_weights(q.view(), k.view(), v.view(), &unscaled)?);
            scaled += largest(&qkv::attention_with_weights(
                q.view(),
                k.view(),
                v.view(),
                &qkv::AttentionOptions::new(),
            )?);
        }
        pair.raw.push(raw / trials as f64);
        pair.scaled.push(scaled / trials as f64);
    }
    Ok(pair)
}
