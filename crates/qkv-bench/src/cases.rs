//! The benchmark's shapes and their random inputs.

use ndarray::Array4;

/// One attention problem: `batch × heads` query heads sharing `kv_heads` key/value heads.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Case {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_k: usize,
    pub d: usize,
    pub causal: bool,
}

impl Case {
    fn single(n_q: usize, n_k: usize, causal: bool) -> Case {
        Case { batch: 1, heads: 1, kv_heads: 1, n_q, n_k, d: 64, causal }
    }

    /// FLOPs as the field counts them: `4 · batch · heads · n_q · n_k · d`, half of it when causal.
    pub fn flops(&self) -> f64 {
        let full = 4.0 * (self.batch * self.heads) as f64 * self.n_q as f64 * self.n_k as f64 * self.d as f64;
        if self.causal { full / 2.0 } else { full }
    }

    /// A short name: `8h n=1024 causal`, `gqa 8/2 n=1024`, `decode 1x16384`.
    pub fn label(&self) -> String {
        let heads = match (self.heads, self.kv_heads) {
            (1, 1) => String::new(),
            (h, kv) if h == kv => format!("{h}h "),
            (h, kv) => format!("gqa {h}/{kv} "),
        };
        let size = if self.n_q == self.n_k {
            format!("n={}", self.n_q)
        } else {
            format!("decode {}x{}", self.n_q, self.n_k)
        };
        format!("{heads}{size}{}", if self.causal { " causal" } else { "" })
    }
}

/// The shapes, d = 64: single heads from 256 to 16384 keys, causal variants, 8 heads,
/// decoding one query over 16384 keys, GQA 8/2, and (not with `--quick`) n = 65536.
pub fn all(quick: bool) -> Vec<Case> {
    let mut cases = vec![
        Case::single(256, 256, false),
        Case::single(1024, 1024, false),
        Case::single(1024, 1024, true),
        Case::single(4096, 4096, false),
        Case::single(4096, 4096, true),
        Case::single(16384, 16384, false),
        Case::single(16384, 16384, true),
        Case { heads: 8, kv_heads: 8, ..Case::single(1024, 1024, false) },
        Case { heads: 8, kv_heads: 8, ..Case::single(1024, 1024, true) },
        Case { heads: 8, kv_heads: 2, ..Case::single(1024, 1024, false) },
        Case::single(1, 16384, false),
    ];
    if !quick {
        cases.push(Case::single(65536, 65536, false));
    }
    cases
}

/// Queries, keys and values, uniform in `[-1, 1]` from a fixed seed.
pub struct Inputs {
    pub q: Array4<f32>,
    pub k: Array4<f32>,
    pub v: Array4<f32>,
}

impl Inputs {
    pub fn random(case: &Case) -> Inputs {
        // A small xorshift: the values only need to be varied and reproducible.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let mut tensor = |heads, n| Array4::from_shape_simple_fn((case.batch, heads, n, case.d), &mut next);
        let q = tensor(case.heads, case.n_q);
        let k = tensor(case.kv_heads, case.n_k);
        let v = tensor(case.kv_heads, case.n_k);
        Inputs { q, k, v }
    }
}
