//! Times the patterns of tile instructions the AMX kernels issue (`crates/qkv/src/kernels/amx.rs`)
//! and one alternative, to see what bounds them on this CPU: products alone, then with the tile
//! loads and stores that feed them, on data in L1 and (the last two) over one key block as the
//! kernel lays it out. Each figure is nanoseconds per `tdpbf16ps` (a 16 × 32 by 32 × 16 bf16
//! product: 16384 FLOPs), the fastest of five rounds. On a shared host the tile unit's rate can
//! change between runs (the other hyperthread of the core uses it too): run it a few times.
//!
//! ```sh
//! cargo run --release -p qkv-bench --example tile_probe
//! ```
//!
//! Tile registers are not renamed: a `tileloadd` into a register that a product still reads waits
//! for that product, which is what the patterns below vary. On a CPU without AMX (or a system
//! that does not grant the tile state) it says so and exits.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod probe {
    use std::arch::asm;
    use std::arch::x86_64::__cpuid_count;
    use std::time::Instant;

    /// `ldtilecfg`'s operand: palette 1, every register 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        bytes_per_row: [u16; 16],
        rows: [u8; 16],
    }

    /// Whether the CPU has AMX-BF16 and AMX-TILE and Linux grants this process the tile state.
    fn tiles_granted() -> bool {
        // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
        let edx = __cpuid_count(7, 0).edx;
        if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
            return false;
        }
        // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
        let result: isize;
        // SAFETY: the system call reads two integers and changes only this process's
        // permissions; `syscall` clobbers rcx and r11, declared here.
        unsafe {
            asm!("syscall", inlateout("rax") 158_isize => result, in("rdi") 0x1023_usize,
                 in("rsi") 18_usize, lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        result == 0
    }

    /// Nanoseconds per product of `body(i)` for `i < n`, `products` products each, with the
    /// operand registers `tmm2`–`tmm5` holding zeros at the start.
    fn rate(n: usize, products: usize, body: impl Fn(usize)) -> f64 {
        // The entries past the eighth are reserved and must be zero.
        let mut config =
            TileConfig { palette: 1, start_row: 0, reserved: [0; 14], bytes_per_row: [0; 16], rows: [0; 16] };
        config.bytes_per_row[..8].fill(64);
        config.rows[..8].fill(16);
        let zeros = [0_u16; 512];
        // SAFETY: `tiles_granted` held (checked by `run`); the configuration is valid for palette
        // 1, and each load reads 16 rows of 64 bytes of `zeros`.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
            for_each_operand(zeros.as_ptr());
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
    unsafe fn for_each_operand(p: *const u16) {
        // SAFETY: the caller guarantees both.
        unsafe {
            asm!("tileloadd tmm2, [{p} + {s}*1]", "tileloadd tmm3, [{p} + {s}*1]",
                 "tileloadd tmm4, [{p} + {s}*1]", "tileloadd tmm5, [{p} + {s}*1]",
                 p = in(reg) p, s = in(reg) 64_usize, options(nostack, readonly));
        }
    }

    /// A pattern's label, how many times it runs, its products per run, and one run.
    type Pattern<'a> = (&'static str, usize, usize, Box<dyn Fn(usize) + 'a>);

    /// Times every pattern and prints one line each.
    pub fn run() {
        if !tiles_granted() {
            println!("this CPU (or system) gives no AMX tiles: nothing to probe");
            return;
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
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm6",
                        "tilezero tmm7",
                        options(nostack, nomem)
                    );
                    for h in 0..2 {
                        asm!("tileloadd tmm2, [{a} + {sa}*1]",
                         "tileloadd tmm3, [{p0} + {s}*1]", "tdpbf16ps tmm0, tmm2, tmm3",
                         "tileloadd tmm3, [{p1} + {s}*1]", "tdpbf16ps tmm1, tmm2, tmm3",
                         "tileloadd tmm3, [{p2} + {s}*1]", "tdpbf16ps tmm6, tmm2, tmm3",
                         "tileloadd tmm3, [{p3} + {s}*1]", "tdpbf16ps tmm7, tmm2, tmm3",
                         a = in(reg) b(i, 0).add(32 * h), sa = in(reg) 128_usize,
                         p0 = in(reg) b(i, 1).add(256 * h), p1 = in(reg) b(i, 2).add(256 * h),
                         p2 = in(reg) b(i, 3).add(256 * h), p3 = in(reg) b(i, 4).add(256 * h),
                         s = in(reg) 64_usize, options(nostack, readonly));
                    }
                    asm!("tilestored [{o} + {s}*1], tmm0", "tilestored [{o1} + {s}*1], tmm1",
                     "tilestored [{o2} + {s}*1], tmm6", "tilestored [{o3} + {s}*1], tmm7",
                     o = in(reg) o, o1 = in(reg) o + 64, o2 = in(reg) o + 128, o3 = in(reg) o + 192,
                     s = in(reg) 512_usize, options(nostack));
                }),
            ),
            (
                "scores at d = 64, two groups' queries held, one panel loaded for both",
                n,
                4,
                Box::new(move |i| unsafe {
                    asm!("tileloadd tmm6, [{p0} + {s}*1]", "tileloadd tmm7, [{p1} + {s}*1]",
                     "tilezero tmm0", "tilezero tmm1",
                     "tdpbf16ps tmm0, tmm2, tmm6", "tdpbf16ps tmm0, tmm3, tmm7",
                     "tdpbf16ps tmm1, tmm4, tmm6", "tdpbf16ps tmm1, tmm5, tmm7",
                     "tilestored [{o} + {so}*1], tmm0", "tilestored [{o1} + {so}*1], tmm1",
                     p0 = in(reg) b(i, 1), p1 = in(reg) b(i, 2), s = in(reg) 64_usize,
                     o = in(reg) o + (i % 4) * 64, o1 = in(reg) o + (i % 4) * 64 + 16384, so = in(reg) 256_usize,
                     options(nostack));
                }),
            ),
            (
                "as the kernel's, over a block's keys (16 KiB) and scores (32 KiB)",
                n / 2,
                8,
                Box::new(move |i| unsafe {
                    let (g, first) = (i / 2, (i % 2) * 4);
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm6",
                        "tilezero tmm7",
                        options(nostack, nomem)
                    );
                    for h in 0..2 {
                        asm!("tileloadd tmm2, [{a} + {sa}*1]",
                         "tileloadd tmm3, [{p0} + {s}*1]", "tdpbf16ps tmm0, tmm2, tmm3",
                         "tileloadd tmm3, [{p1} + {s}*1]", "tdpbf16ps tmm1, tmm2, tmm3",
                         "tileloadd tmm3, [{p2} + {s}*1]", "tdpbf16ps tmm6, tmm2, tmm3",
                         "tileloadd tmm3, [{p3} + {s}*1]", "tdpbf16ps tmm7, tmm2, tmm3",
                         a = in(reg) b(g, 0).add(32 * h), sa = in(reg) 128_usize,
                         p0 = in(reg) panel(first, h), p1 = in(reg) panel(first + 1, h),
                         p2 = in(reg) panel(first + 2, h), p3 = in(reg) panel(first + 3, h),
                         s = in(reg) 64_usize, options(nostack, readonly));
                    }
                    asm!("tilestored [{o} + {s}*1], tmm0", "tilestored [{o1} + {s}*1], tmm1",
                     "tilestored [{o2} + {s}*1], tmm6", "tilestored [{o3} + {s}*1], tmm7",
                     o = in(reg) score(g, first), o1 = in(reg) score(g, first + 1),
                     o2 = in(reg) score(g, first + 2), o3 = in(reg) score(g, first + 3),
                     s = in(reg) 512_usize, options(nostack));
                }),
            ),
            (
                "two groups held, over a block's keys and scores",
                n,
                4,
                Box::new(move |i| unsafe {
                    let (g, p) = (2 * (i / 8), i % 8);
                    asm!("tileloadd tmm6, [{p0} + {s}*1]", "tileloadd tmm7, [{p1} + {s}*1]",
                     "tilezero tmm0", "tilezero tmm1",
                     "tdpbf16ps tmm0, tmm2, tmm6", "tdpbf16ps tmm0, tmm3, tmm7",
                     "tdpbf16ps tmm1, tmm4, tmm6", "tdpbf16ps tmm1, tmm5, tmm7",
                     "tilestored [{o} + {so}*1], tmm0", "tilestored [{o1} + {so}*1], tmm1",
                     p0 = in(reg) panel(p, 0), p1 = in(reg) panel(p, 1), s = in(reg) 64_usize,
                     o = in(reg) score(g, p), o1 = in(reg) score(g + 1, p), so = in(reg) 512_usize,
                     options(nostack));
                }),
            ),
        ];
        for (label, n, products, body) in &patterns {
            let best = (0..5).map(|_| rate(*n, *products, body)).fold(f64::INFINITY, f64::min);
            println!("{best:6.1} ns per product  {label}");
        }
    }
}

fn main() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    probe::run();
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    println!("the tile probe runs on x86-64 Linux only");
}
