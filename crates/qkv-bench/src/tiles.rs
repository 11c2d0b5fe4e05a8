//! What the AMX tile unit does on this machine: the patterns of tile instructions the AMX kernels
//! issue (`crates/qkv/src/kernels/amx.rs`) and one alternative, timed alone, to see what bounds
//! the kernels: products alone, then with the tile loads and stores that feed them, on data in L1
//! and (the last two) over one key block as the kernel lays it out. Each figure is nanoseconds per
//! `tdpbf16ps` (a 16 × 32 by 32 × 16 bf16 product: 16384 FLOPs), the fastest of five rounds.
//! `qkv-bench --tile-probe` prints them all; a sitting prints the first (products alone) before
//! and after its cases, as it does the GEMM ceiling, because on a shared host another tenant (most
//! likely on the core's other hyperthread) can halve the unit's rate from one minute to the next.
//!
//! Tile registers are not renamed: a `tileloadd` into a register that a product still reads waits
//! for that product, which is what the patterns vary. Without AMX (or where the system does not
//! grant the tile state) there is nothing to measure.

/// Each pattern's label and nanoseconds per product, the first `count` of them; `None` without
/// AMX.
pub fn measure(count: usize) -> Option<Vec<(&'static str, f64)>> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    return probe::measure(count);
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = count;
        None
    }
}

/// Nanoseconds per product of the tile unit's products alone; `None` without AMX.
pub fn products_alone() -> Option<f64> {
    measure(1).map(|figures| figures[0].1)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod probe {
    use std::arch::asm;
    use std::time::Instant;

    /// `ldtilecfg`'s 64-byte operand.
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    impl TileConfig {
        /// Palette 1, registers `tmm0`–`tmm7` each 16 rows of 64 bytes: byte 0 is the palette,
        /// bytes 16–31 the registers' bytes per row (16-bit), bytes 48–55 their rows; the rest
        /// is reserved and zero.
        fn whole_tiles() -> TileConfig {
            let mut bytes = [0_u8; 64];
            bytes[0] = 1;
            for t in 0..8 {
                bytes[16 + 2 * t..18 + 2 * t].copy_from_slice(&64_u16.to_le_bytes());
                bytes[48 + t] = 16;
            }
            TileConfig(bytes)
        }
    }

    /// Nanoseconds per product of `body(i)` for `i < n`, `products` products each, with the
    /// operand registers `tmm2`–`tmm5` holding zeros at the start.
    ///
    /// # Safety
    /// The CPU must run AMX with the tile state granted to the process.
    unsafe fn rate(n: usize, products: usize, body: impl Fn(usize)) -> f64 {
        let config = TileConfig::whole_tiles();
        let zeros = [0_u16; 512];
        // SAFETY: the caller guarantees AMX; the configuration is valid for palette 1, and each
        // load reads 16 rows of 64 bytes of `zeros`.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
            load_operands(zeros.as_ptr());
        }
        let start = Instant::now();
        for i in 0..n {
            body(i);
        }
        let ns = start.elapsed().as_nanos() as f64 / (n * products) as f64;
        // SAFETY: the tiles were configured above.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        ns
    }

    /// Loads 16 rows of 64 bytes from `p` into `tmm2`–`tmm5`.
    ///
    /// # Safety
    /// The tiles must be configured, and `p` readable for 1024 bytes.
    unsafe fn load_operands(p: *const u16) {
        // SAFETY: the caller guarantees both.
        unsafe {
            asm!("tileloadd tmm2, [{p} + {s}*1]", "tileloadd tmm3, [{p} + {s}*1]",
                 "tileloadd tmm4, [{p} + {s}*1]", "tileloadd tmm5, [{p} + {s}*1]",
                 p = in(reg) p, s = in(reg) 64_usize, options(nostack, readonly));
        }
    }

    /// One pass of the score kernel's pattern at d = 64: four sums zeroed; for each half `h` of
    /// the depth, a query tile from `query(h)` (rows 128 bytes apart) and four panel tiles from
    /// `panel(j, h)`, each followed by its product; the four sums stored at `store(j)`, rows 512
    /// bytes apart.
    ///
    /// # Safety
    /// The tiles must be configured (`rate`), and every address readable (writable) for 16 rows.
    #[inline(always)]
    unsafe fn one_group(
        query: impl Fn(usize) -> *const u16,
        panel: impl Fn(usize, usize) -> *const u16,
        store: impl Fn(usize) -> usize,
    ) {
        // SAFETY: the caller guarantees the configuration and the addresses.
        unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
            for h in 0..2 {
                asm!("tileloadd tmm2, [{a} + {sa}*1]",
                     "tileloadd tmm3, [{p0} + {s}*1]", "tdpbf16ps tmm0, tmm2, tmm3",
                     "tileloadd tmm3, [{p1} + {s}*1]", "tdpbf16ps tmm1, tmm2, tmm3",
                     "tileloadd tmm3, [{p2} + {s}*1]", "tdpbf16ps tmm6, tmm2, tmm3",
                     "tileloadd tmm3, [{p3} + {s}*1]", "tdpbf16ps tmm7, tmm2, tmm3",
                     a = in(reg) query(h), sa = in(reg) 128_usize,
                     p0 = in(reg) panel(0, h), p1 = in(reg) panel(1, h),
                     p2 = in(reg) panel(2, h), p3 = in(reg) panel(3, h),
                     s = in(reg) 64_usize, options(nostack, readonly));
            }
            asm!("tilestored [{o0} + {s}*1], tmm0", "tilestored [{o1} + {s}*1], tmm1",
                 "tilestored [{o2} + {s}*1], tmm6", "tilestored [{o3} + {s}*1], tmm7",
                 o0 = in(reg) store(0), o1 = in(reg) store(1), o2 = in(reg) store(2), o3 = in(reg) store(3),
                 s = in(reg) 512_usize, options(nostack));
        }
    }

    /// Two groups' queries held in `tmm2`–`tmm5` (both halves of the depth each): one panel's two
    /// tiles from `panel`, two sums zeroed, four products, and the sums stored at `stores`, rows
    /// `stride` bytes apart.
    ///
    /// # Safety
    /// As [`one_group`].
    #[inline(always)]
    unsafe fn two_groups(panel: [*const u16; 2], stores: [usize; 2], stride: usize) {
        // SAFETY: the caller guarantees the configuration and the addresses.
        unsafe {
            asm!("tileloadd tmm6, [{p0} + {s}*1]", "tileloadd tmm7, [{p1} + {s}*1]",
                 "tilezero tmm0", "tilezero tmm1",
                 "tdpbf16ps tmm0, tmm2, tmm6", "tdpbf16ps tmm0, tmm3, tmm7",
                 "tdpbf16ps tmm1, tmm4, tmm6", "tdpbf16ps tmm1, tmm5, tmm7",
                 "tilestored [{o0} + {so}*1], tmm0", "tilestored [{o1} + {so}*1], tmm1",
                 p0 = in(reg) panel[0], p1 = in(reg) panel[1], s = in(reg) 64_usize,
                 o0 = in(reg) stores[0], o1 = in(reg) stores[1], so = in(reg) stride,
                 options(nostack));
        }
    }

    /// A pattern's label, how many times it runs, its products per run, and one run.
    type Pattern<'a> = (&'static str, usize, usize, Box<dyn Fn(usize) + 'a>);

    /// See [`super::measure`].
    pub fn measure(count: usize) -> Option<Vec<(&'static str, f64)>> {
        // qkv's detection asks Linux for the tile state, once for the whole process.
        if !qkv::SimdLevel::Amx.is_supported() {
            return None;
        }
        let data = vec![0_u16; 16 * 1024];
        let mut out = vec![0_f32; 8 * 1024];
        // As the kernel's block lies: 128 keys in 8 panels of 2 KiB (d = 64), scores in rows of
        // 128 f32 (512 bytes) for 64 queries.
        let keys = vec![0_u16; 8 * 1024];
        let mut scores = vec![0_f32; 64 * 128];
        let panel = |p: usize, h: usize| keys[(p % 8) * 1024 + h * 512..].as_ptr();
        let s0 = scores.as_mut_ptr() as usize;
        let score = move |g: usize, p: usize| s0 + (g % 4) * 16 * 512 + (p % 8) * 64;
        // Operands from places 1 KiB apart, so that no load reads what the last one did.
        let b = |i: usize, j: usize| data[(i % 8 + j) * 512..].as_ptr();
        let o = out.as_mut_ptr() as usize;
        let n = 50_000;
        // SAFETY (every pattern): the tiles are configured by `rate`. Each load reads 16 rows of
        // 64 bytes, 64 or 128 bytes apart: from `b(i, j)` (j <= 4, plus at most 512 bytes) inside
        // `data` (32 KiB), or from `panel(p, h)` inside `keys` (16 KiB, the last panel's second
        // half ending at its end). Each store writes 16 rows of 64 bytes: 256 bytes apart from at
        // most 16576 bytes into `out` (32 KiB), 512 bytes apart from at most 192 bytes into it,
        // or 512 bytes apart from `score(g, p)` inside `scores` (32 KiB, the last row of group 3's
        // panel 7 ending at its end).
        let patterns: [Pattern<'_>; 8] = [
            (
                "products only (4 sums, operands held)",
                n,
                4,
                Box::new(|_| unsafe {
                    asm!(
                        "tdpbf16ps tmm0, tmm2, tmm3",
                        "tdpbf16ps tmm1, tmm2, tmm3",
                        "tdpbf16ps tmm6, tmm2, tmm3",
                        "tdpbf16ps tmm7, tmm2, tmm3",
                        options(nostack, nomem)
                    );
                }),
            ),
            (
                "+ one A load per 4 products",
                n,
                4,
                Box::new(move |i| unsafe {
                    asm!("tileloadd tmm2, [{p} + {s}*1]", "tdpbf16ps tmm0, tmm2, tmm3",
                     "tdpbf16ps tmm1, tmm2, tmm3", "tdpbf16ps tmm6, tmm2, tmm3", "tdpbf16ps tmm7, tmm2, tmm3",
                     p = in(reg) b(i, 0), s = in(reg) 64_usize, options(nostack, readonly));
                }),
            ),
            (
                "+ a B load before each product (into the register the last one read)",
                n,
                4,
                Box::new(move |i| unsafe {
                    asm!("tileloadd tmm3, [{p0} + {s}*1]", "tdpbf16ps tmm0, tmm2, tmm3",
                     "tileloadd tmm3, [{p1} + {s}*1]", "tdpbf16ps tmm1, tmm2, tmm3",
                     "tileloadd tmm3, [{p2} + {s}*1]", "tdpbf16ps tmm6, tmm2, tmm3",
                     "tileloadd tmm3, [{p3} + {s}*1]", "tdpbf16ps tmm7, tmm2, tmm3",
                     p0 = in(reg) b(i, 0), p1 = in(reg) b(i, 1), p2 = in(reg) b(i, 2), p3 = in(reg) b(i, 3),
                     s = in(reg) 64_usize, options(nostack, readonly));
                }),
            ),
            (
                "+ a zeroed sum and its store per product",
                n,
                4,
                Box::new(move |_| unsafe {
                    asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm6", "tilezero tmm7",
                     "tdpbf16ps tmm0, tmm2, tmm3", "tdpbf16ps tmm1, tmm2, tmm3",
                     "tdpbf16ps tmm6, tmm2, tmm3", "tdpbf16ps tmm7, tmm2, tmm3",
                     "tilestored [{o} + {s}*1], tmm0", "tilestored [{o1} + {s}*1], tmm1",
                     "tilestored [{o2} + {s}*1], tmm6", "tilestored [{o3} + {s}*1], tmm7",
                     o = in(reg) o, o1 = in(reg) o + 64, o2 = in(reg) o + 128, o3 = in(reg) o + 192,
                     s = in(reg) 256_usize, options(nostack));
                }),
            ),
            (
                "scores at d = 64, one group of 16 queries, 4 panels a pass (the kernel's)",
                n / 2,
                8,
                Box::new(move |i| unsafe {
                    one_group(|h| b(i, 0).add(32 * h), |j, h| b(i, 1 + j).add(256 * h), |j| o + 64 * j);
                }),
            ),
            (
                "scores at d = 64, two groups' queries held, one panel loaded for both",
                n,
                4,
                Box::new(move |i| unsafe {
                    let at = o + (i % 4) * 64;
                    two_groups([b(i, 1), b(i, 2)], [at, at + 16384], 256);
                }),
            ),
            (
                "as the kernel's, over a block's keys (16 KiB) and scores (32 KiB)",
                n / 2,
                8,
                Box::new(move |i| unsafe {
                    let (g, first) = (i / 2, (i % 2) * 4);
                    one_group(|h| b(g, 0).add(32 * h), |j, h| panel(first + j, h), |j| score(g, first + j));
                }),
            ),
            (
                "two groups held, over a block's keys and scores",
                n,
                4,
                Box::new(move |i| unsafe {
                    let (g, p) = (2 * (i / 8), i % 8);
                    two_groups([panel(p, 0), panel(p, 1)], [score(g, p), score(g + 1, p)], 512);
                }),
            ),
        ];
        let figures = patterns
            .iter()
            .take(count)
            .map(|(label, n, products, body)| {
                // SAFETY: the AMX level was detected above, which granted the tile state.
                let best = (0..5).map(|_| unsafe { rate(*n, *products, body) }).fold(f64::INFINITY, f64::min);
                (*label, best)
            })
            .collect();
        Some(figures)
    }
}
