//! The benchmark's shapes and their random inputs.

use ndarray::Array4;

/// How a case's inputs are stored (every implementation computes in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    /// A KV cache's int8 storage (`KvCache<Q8>`: one f32 scale per position and head of keys and
    /// of values).
    Int8,
}

/// One attention problem: `batch × heads` query heads sharing `kv_heads` key/value heads.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Case {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_k: usize,
    pub d: usize,
    pub causal: bool,
    #[serde(default)]
    pub precision: Precision,
    /// A decoding step over a KV cache that already holds the `n_k` keys and values (qkv's
    /// `KvCache`; the peers take the same tensors as they are).
    #[serde(default)]
    pub cache: bool,
    /// The backward alone (`dQ`, `dK`, `dV` from the output's gradient; the forward runs before
    /// the timing).
    #[serde(default)]
    pub backward: bool,
    /// A ragged batch: sequence `b` holds `(b + 1) · n_k / batch` positions, `n_k` the longest.
    /// Decoding one step each over qkv's `PagedKvCache` (the peers take the padded tensors with
    /// each sequence's key length), or with `n_q = n_k` a packed prefill, each sequence's
    /// positions its queries (qkv's `varlen_attention`, beside a call per sequence).
    #[serde(default)]
    pub ragged: bool,
}

impl Case {
    fn single(n_q: usize, n_k: usize, causal: bool) -> Case {
        Case {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            n_q,
            n_k,
            d: 64,
            causal,
            precision: Precision::F32,
            cache: false,
            backward: false,
            ragged: false,
        }
    }

    /// The backward of a single head of `n` queries and keys of width `d`.
    fn backward(n: usize, d: usize, causal: bool) -> Case {
        Case { d, backward: true, ..Case::single(n, n, causal) }
    }

    /// FLOPs as the field counts them: `4 · batch · heads · n_q · n_k · d`, half of it when causal;
    /// a backward 2.5 times that (FlashAttention-2's count: five products of the forward's size
    /// against its two, whatever an implementation recomputes).
    pub fn flops(&self) -> f64 {
        let pairs: f64 = if self.packed_prefill() {
            self.lengths().iter().map(|&len| (len * len) as f64).sum()
        } else {
            self.n_q as f64 * self.keys() as f64
        };
        let full = 4.0 * self.heads as f64 * pairs * self.d as f64;
        let pass = if self.backward { 2.5 } else { 1.0 };
        if self.causal { pass * full / 2.0 } else { pass * full }
    }

    /// Each sequence's keys: `n_k` for every one, or the ragged lengths.
    pub fn lengths(&self) -> Vec<usize> {
        if self.ragged {
            (1..=self.batch).map(|b| b * self.n_k / self.batch).collect()
        } else {
            vec![self.n_k; self.batch]
        }
    }

    /// A ragged batch of prefills: each sequence's positions are its queries and its keys.
    pub fn packed_prefill(&self) -> bool {
        self.ragged && self.n_q == self.n_k
    }

    /// Keys over the whole batch.
    fn keys(&self) -> usize {
        self.lengths().iter().sum()
    }

    /// A short name: `8h n=1024 causal`, `4x8h n=128`, `gqa 8/2 n=1024`, `decode 1x16384`,
    /// `gqa 32/8 decode 1x4096`, `cache gqa 32/8 decode 1x8192 d=128 bf16`, `cache gqa 32/8 decode 1x8192 d=128 int8`, `n=4096 bf16`,
    /// `paged ragged 8xgqa 32/8 decode 1x4096 d=128`, `varlen ragged 8xgqa 8/2 n=1024 causal`.
    pub fn label(&self) -> String {
        let cache = match (self.cache, self.ragged) {
            (_, true) if self.packed_prefill() => "varlen ragged ",
            (_, true) => "paged ragged ",
            (true, false) => "cache ",
            (false, false) => "",
        };
        let d = if self.d == 64 { String::new() } else { format!(" d={}", self.d) };
        let precision = match self.precision {
            Precision::F32 => "",
            Precision::Bf16 => " bf16",
            Precision::Int8 => " int8",
        };
        let backward = if self.backward { " backward" } else { "" };
        format!("{cache}{}{d}{precision}{backward}", self.attention_label())
    }

    /// The label's heads, sizes and mask.
    fn attention_label(&self) -> String {
        let batch = if self.batch == 1 { String::new() } else { format!("{}x", self.batch) };
        let heads = match (self.heads, self.kv_heads) {
            (1, 1) => String::new(),
            (h, kv) if h == kv => format!("{batch}{h}h "),
            (h, kv) => format!("{batch}gqa {h}/{kv} "),
        };
        let size = if self.n_q == self.n_k {
            format!("n={}", self.n_q)
        } else {
            format!("decode {}x{}", self.n_q, self.n_k)
        };
        format!("{heads}{size}{}", if self.causal { " causal" } else { "" })
    }

    /// A decoding step: few queries over a long sequence of keys, which it reads once, so that
    /// memory bandwidth rather than arithmetic bounds it.
    pub fn decodes(&self) -> bool {
        self.n_q < self.n_k && self.n_q <= 4
    }

    /// Bytes of keys and values, each read once by a decoding step.
    pub fn kv_bytes(&self) -> usize {
        let row = match self.precision {
            Precision::F32 => self.d * size_of::<f32>(),
            Precision::Bf16 => self.d * 2,
            // One byte per element and the row's f32 scale.
            Precision::Int8 => self.d + size_of::<f32>(),
        };
        2 * self.kv_heads * self.keys() * row
    }
}

/// The shapes, d = 64: single heads from 256 to 16384 keys, causal variants; 8 heads of
/// 256 and 1024, a batch of 4 × 8 heads of 128 and of 16 (short sequences, where each head's
/// fixed costs weigh), GQA 8/2; decoding one query over 1024, 16384 and
/// 131072 keys, and a GQA decoding step (32 query heads over 8 KV heads, one query each); full
/// attention over bf16 inputs at n = 4096 and over 8 bf16 query heads on 2 KV heads of 1024;
/// decoding over bf16 keys and values as they are (no cache): one query over 16384, and the GQA
/// step over 4096; the KV-cache decoding step (a layer of 32
/// query heads over 8 KV heads, d = 128, one new token over 1k to 32k cached positions, doubling),
/// in f32, bf16 and int8; a ragged batch of 8 such layers' sequences over the paged cache, the longest
/// 4096 and 16384 positions, the others an eighth, two eighths, ... of it; a packed causal
/// prefill of 8 sequences of 128 to 1024 tokens alike (GQA 8/2); the backward of a single head at n = 1024, 4096 and 16384, d = 64 and 128, causal
/// and not, and of bf16 inputs at n = 1024 and 4096; and (not with `--quick`) n = 65536.
pub fn all(quick: bool) -> Vec<Case> {
    let heads = |heads, kv_heads, case: Case| Case { heads, kv_heads, ..case };
    let mut cases = vec![
        Case::single(256, 256, false),
        Case::single(1024, 1024, false),
        Case::single(1024, 1024, true),
        Case::single(4096, 4096, false),
        Case::single(4096, 4096, true),
        Case::single(16384, 16384, false),
        Case::single(16384, 16384, true),
        heads(8, 8, Case::single(256, 256, false)),
        Case { batch: 4, ..heads(8, 8, Case::single(128, 128, false)) },
        Case { batch: 4, ..heads(8, 8, Case::single(16, 16, false)) },
        heads(8, 8, Case::single(1024, 1024, false)),
        heads(8, 8, Case::single(1024, 1024, true)),
        heads(8, 2, Case::single(1024, 1024, false)),
        Case::single(1, 1024, false),
        Case::single(1, 16384, false),
        Case::single(1, 131072, false),
        heads(32, 8, Case::single(1, 4096, false)),
        heads(32, 8, Case::single(1, 16384, false)),
        Case { precision: Precision::Bf16, ..Case::single(4096, 4096, false) },
        Case { precision: Precision::Bf16, ..heads(8, 2, Case::single(1024, 1024, false)) },
        Case { precision: Precision::Bf16, ..Case::single(1, 16384, false) },
        Case { precision: Precision::Bf16, ..heads(32, 8, Case::single(1, 4096, false)) },
    ];
    for n_k in [1024, 2048, 4096, 8192, 16384, 32768] {
        for precision in [Precision::F32, Precision::Bf16, Precision::Int8] {
            cases.push(Case { d: 128, precision, cache: true, ..heads(32, 8, Case::single(1, n_k, false)) });
        }
    }
    for n_k in [4096, 16384] {
        cases.push(Case { batch: 8, d: 128, ragged: true, ..heads(32, 8, Case::single(1, n_k, false)) });
    }
    cases.push(Case { batch: 8, ragged: true, ..heads(8, 2, Case::single(1024, 1024, true)) });
    for n in [1024, 4096, 16384] {
        for d in [64, 128] {
            cases.extend([false, true].map(|causal| Case::backward(n, d, causal)));
        }
    }
    for n in [1024, 4096] {
        cases.push(Case { precision: Precision::Bf16, ..Case::backward(n, 64, false) });
    }
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
