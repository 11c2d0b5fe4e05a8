//! Random attention problems for the tests, and the one tolerance helper they all use.

use ndarray::{Array1, Array2};
use qkv::{
    AdditiveBias, Alibi, AttentionOptions, CausalMask, KeepMask, KeyPadding, Real, SimdLevel, SlidingWindow,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Which masks a random problem carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    None,
    CausalBottomRight,
    CausalTopLeft,
    /// A random keep-mask in which some rows hide every key.
    KeepWithEmptyRows,
    /// Padding that hides every key but the first.
    Padding,
    /// A random bias, `-inf` in places.
    Bias,
    /// Padding that hides every other block of 64 keys: whole tiles with nothing visible.
    PaddingBlocks,
    /// Key length two thirds of the keys (0 for one key: every row fully masked).
    KeyLength,
    /// A causal sliding window of 100 keys back (whole tiles before it are skipped).
    CausalWindow,
    /// A top-left window of 3 keys back and 20 forward, without a causal mask.
    WindowTopLeft,
    /// ALiBi with the causal mask.
    Alibi,
}

pub const MASK_KINDS: [MaskKind; 11] = [
    MaskKind::None,
    MaskKind::CausalBottomRight,
    MaskKind::CausalTopLeft,
    MaskKind::KeepWithEmptyRows,
    MaskKind::Padding,
    MaskKind::Bias,
    MaskKind::PaddingBlocks,
    MaskKind::KeyLength,
    MaskKind::CausalWindow,
    MaskKind::WindowTopLeft,
    MaskKind::Alibi,
];

/// Inputs of one attention problem, with the data its masks borrow from.
pub struct Problem<T> {
    pub q: Array2<T>,
    pub k: Array2<T>,
    pub v: Array2<T>,
    pub mask: MaskKind,
    keep: Array2<bool>,
    padding: Array1<bool>,
    bias: Array2<T>,
    key_length: [usize; 1],
    slope: [T; 1],
    softcap: Option<T>,
}

impl<T: Real> Problem<T> {
    /// Entries uniform in `[-magnitude, magnitude]`.
    pub fn random(
        seed: u64,
        (n_q, n_k, d_k, d_v): (usize, usize, usize, usize),
        magnitude: f64,
        mask: MaskKind,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let matrix = |rows, cols, rng: &mut ChaCha8Rng| {
            Array2::from_shape_simple_fn((rows, cols), || {
                T::from_f64_round(rng.random_range(-1.0..=1.0) * magnitude)
            })
        };
        let q = matrix(n_q, d_k, &mut rng);
        let k = matrix(n_k, d_k, &mut rng);
        let v = matrix(n_k, d_v, &mut rng);
        let keep = Array2::from_shape_fn((n_q, n_k), |(i, _)| i % 3 != 1 && rng.random_bool(0.6));
        let padding = match mask {
            MaskKind::PaddingBlocks => Array1::from_shape_fn(n_k, |j| (j / 64) % 2 == 0),
            _ => Array1::from_shape_fn(n_k, |j| j == 0),
        };
        let bias = Array2::from_shape_simple_fn((n_q, n_k), || {
            if rng.random_bool(0.2) {
                T::neg_infinity()
            } else {
                T::from_f64_round(rng.random_range(-2.0..2.0))
            }
        });
        let key_length = [2 * n_k / 3];
        let slope = [T::from_f64_round(0.3)];
        Problem { q, k, v, mask, keep, padding, bias, key_length, slope, softcap: None }
    }

    /// The same problem with its scores soft-capped at `cap` (see `AttentionOptions::logit_softcap`).
    pub fn capped(self, cap: Option<f64>) -> Self {
        Problem { softcap: cap.map(T::from_f64_round), ..self }
    }

    /// The bias that [`MaskKind::Bias`] adds (random, `-inf` in places).
    pub fn bias(&self) -> &Array2<T> {
        &self.bias
    }

    pub fn options(&self) -> AttentionOptions<'_, T> {
        let o = match self.softcap {
            Some(cap) => AttentionOptions::new().logit_softcap(cap),
            None => AttentionOptions::new(),
        };
        match self.mask {
            MaskKind::None => o,
            MaskKind::CausalBottomRight => o.causal(CausalMask::BottomRight),
            MaskKind::CausalTopLeft => o.causal(CausalMask::TopLeft),
            MaskKind::KeepWithEmptyRows => o.keep_mask(KeepMask::new(self.keep.view())),
            MaskKind::Padding | MaskKind::PaddingBlocks => {
                o.key_padding(KeyPadding::new(self.padding.view()))
            }
            MaskKind::Bias => o.bias(AdditiveBias::new(self.bias.view())),
            MaskKind::KeyLength => o.key_lengths(&self.key_length),
            MaskKind::CausalWindow => {
                o.causal(CausalMask::BottomRight).sliding_window(SlidingWindow::new(100, 0))
            }
            MaskKind::WindowTopLeft => {
                o.sliding_window(SlidingWindow::new(3, 20).aligned(CausalMask::TopLeft))
            }
            MaskKind::Alibi => o.causal(CausalMask::BottomRight).alibi(Alibi::new(&self.slope)),
        }
    }
}

/// The tolerance every comparison with the reference uses, stated once:
/// `|got - want| <= tol · bound`, with `tol` = 1e-12 for f64 and 2e-5 for f32, and `bound` the
/// size of the quantity's condition: rounding in a score of size `s` moves a weight by about
/// `eps · s`, and an output by that times the largest value. Use [`error_bound`] to get it.
pub fn assert_close<T: Real>(what: &str, got: &Array2<T>, want: &Array2<f64>, bound: f64) {
    let tol = if T::NAME == "f32" { F32_TOLERANCE } else { 1e-12 };
    assert_eq!(got.shape(), want.shape(), "{what}: shapes differ");
    for ((idx, g), w) in got.indexed_iter().zip(want.iter()) {
        let g = g.to_f64_exact();
        assert!((g - w).abs() <= tol * bound, "{what}{idx:?}: got {g}, want {w} (tol {tol} x {bound})");
    }
}

/// The `tol` of [`assert_close`] for f32.
pub const F32_TOLERANCE: f64 = 2e-5;

/// How far `level` may move an output of inputs stored as `storage` (`"bf16"`, …) whose values
/// reach `max_value`, beyond f32 arithmetic on the widened inputs: the levels that multiply bf16
/// (AMX, AVX512-BF16) round each weight to bf16 before `P·V` (unit roundoff 2^-8), and since the
/// weights sum to 1 that moves an output by at most 2^-8 of the largest value. 0 for every other
/// level and type, whose results are the f32 path's bit for bit.
pub fn weight_rounding(level: SimdLevel, storage: &str, max_value: f64) -> f64 {
    if pair_level(level) && storage == "bf16" { 2f64.powi(-8) * max_value } else { 0.0 }
}

/// Whether `level` is a pair level, whose forward rounds bf16 weights: the tile unit or
/// AVX512-BF16.
pub fn pair_level(level: SimdLevel) -> bool {
    matches!(level, SimdLevel::Amx | SimdLevel::Avx512Bf16)
}

/// Whether the bf16 backward at `level` takes its scores from the level's bf16 products, which
/// sum in another order than the f32 backward's: always at AMX, and at AVX512-BF16 on AMD's CPUs
/// (read here from CPUID leaf 0's vendor string, apart from the engine's own detection). Elsewhere
/// the bf16 backward is the f32 backward on the widened inputs, bit for bit.
pub fn backward_on_pair_products(level: SimdLevel) -> bool {
    match level {
        SimdLevel::Amx => true,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Bf16 => {
            let vendor = std::arch::x86_64::__cpuid(0);
            let bytes: Vec<u8> =
                [vendor.ebx, vendor.edx, vendor.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
            bytes == b"AuthenticAMD"
        }
        _ => false,
    }
}

/// `bound` of [`assert_close`] for f32 results, widened by `rounding` (see [`weight_rounding`]).
pub fn with_rounding(bound: f64, rounding: f64) -> f64 {
    bound + rounding / F32_TOLERANCE
}

/// `got` against the f32 path's result on the widened inputs: bit for bit, or within `rounding`
/// (see [`weight_rounding`]) and f32's own error where the level rounds the weights.
pub fn assert_f32_path<D: ndarray::Dimension>(
    what: &str,
    got: &ndarray::Array<f32, D>,
    f32_path: &ndarray::Array<f32, D>,
    rounding: f64,
) {
    if rounding == 0.0 {
        assert_eq!(got, f32_path, "{what}: the f32 path on the widened inputs, bit for bit");
        return;
    }
    assert_eq!(got.shape(), f32_path.shape(), "{what}: shapes differ");
    for ((idx, g), f) in got.indexed_iter().zip(f32_path) {
        let (g, f) = (f64::from(*g), f64::from(*f));
        let bound = rounding + 1e-6 * (1.0 + f.abs());
        assert!((g - f).abs() <= bound, "{what}{idx:?}: {g} against the f32 path's {f}, beyond {bound:e}");
    }
}

/// The largest `|v|` of `v`.
pub fn max_abs<'a>(v: impl IntoIterator<Item = &'a f32>) -> f64 {
    v.into_iter().fold(0.0_f64, |m, &x| m.max(f64::from(x).abs()))
}

/// The bounds for weights and outputs of a problem: `(1 + max |s|)` and that times `(1 + max |v|)`.
pub fn error_bound<T: Real>(reference: &qkv::Attention<f64>, v: &Array2<T>) -> (f64, f64) {
    let max_score = reference.scores.iter().filter(|s| s.is_finite()).fold(0.0_f64, |m, s| m.max(s.abs()));
    let max_value = v.iter().fold(0.0_f64, |m, x| m.max(x.to_f64_exact().abs()));
    let weights = 1.0 + max_score;
    (weights, weights * (1.0 + max_value))
}

/// The SIMD levels this CPU runs, lowest first: the fast path's tests run at each. The levels it
/// lacks are named once on stdout (`cargo test -- --nocapture`), so a log says what was covered.
pub fn levels() -> Vec<SimdLevel> {
    static SKIPPED: std::sync::Once = std::sync::Once::new();
    SKIPPED.call_once(|| {
        for level in SimdLevel::ALL.into_iter().filter(|level| !level.is_supported()) {
            println!("SIMD level {level}: not tested, this CPU does not run it");
        }
    });
    SimdLevel::ALL.into_iter().filter(|level| level.is_supported()).collect()
}
