//! Where the query diagram's labels go: each beside its own arrow's tip, clear of the other
//! labels and of every arrowhead, crossing as few shafts as it can.
//!
//! The labels of arrows that end at one point (a key equal to the query) are stacked into one
//! block, so two labels never compete for the same tip. Each block tries a fixed set of spots
//! around its tip, one line or, for keys, two (name over weight) where one line does not fit. A
//! spot's cost adds up what a reader would trip over; blocks are placed in turn and then moved
//! one at a time to their cheapest spot until none moves, so the result is deterministic.

use plotters::prelude::*;

use crate::theme::{GAP, measure};

/// Arrowhead length and half-width in pixels, before the shaft's width is added.
const HEAD: f64 = 12.0;
const HEAD_HALF: f64 = 5.0;
/// Tips closer than this many pixels count as one point.
const SAME_TIP: f64 = 4.0;
/// Space between the lines of a block.
const LINE_GAP: i32 = 2;
/// How far the white halo behind a label reaches past its text, across and down.
const HALO: (i32, i32) = (2, 1);

/// An axis-aligned box in pixels; `x1` and `y1` lie just past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rect {
    pub x0: i32,
    pub y0: i32,
    pub x1: i32,
    pub y1: i32,
}

impl Rect {
    pub fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    fn grown(&self, by: i32) -> Rect {
        Rect { x0: self.x0 - by, y0: self.y0 - by, x1: self.x1 + by, y1: self.y1 + by }
    }

    /// The box behind the text that hides grid lines.
    pub fn halo(&self) -> Rect {
        Rect { x0: self.x0 - HALO.0, y0: self.y0 - HALO.1, x1: self.x1 + HALO.0, y1: self.y1 + HALO.1 }
    }

    /// Pixels from `p` to the nearest point of the box.
    pub fn distance_to(&self, p: (f64, f64)) -> f64 {
        let dx = (f64::from(self.x0) - p.0).max(p.0 - f64::from(self.x1)).max(0.0);
        let dy = (f64::from(self.y0) - p.1).max(p.1 - f64::from(self.y1)).max(0.0);
        dx.hypot(dy)
    }

    fn centre(&self) -> (f64, f64) {
        (f64::from(self.x0 + self.x1) / 2.0, f64::from(self.y0 + self.y1) / 2.0)
    }

    /// The same box moved the least that puts it inside `bounds` (its top left if it is larger).
    fn moved_into(&self, bounds: &Rect) -> Rect {
        let shift = |lo: i32, hi: i32, min: i32, max: i32| {
            if hi > max {
                (max - hi).max(min - lo)
            } else if lo < min {
                min - lo
            } else {
                0
            }
        };
        let dx = shift(self.x0, self.x1, bounds.x0, bounds.x1);
        let dy = shift(self.y0, self.y1, bounds.y0, bounds.y1);
        Rect { x0: self.x0 + dx, y0: self.y0 + dy, x1: self.x1 + dx, y1: self.y1 + dy }
    }

    /// Whether the convex polygon `poly` reaches inside the box (separating axes).
    pub fn meets_polygon(&self, poly: &[(f64, f64)]) -> bool {
        let corners = [
            (f64::from(self.x0), f64::from(self.y0)),
            (f64::from(self.x1), f64::from(self.y0)),
            (f64::from(self.x1), f64::from(self.y1)),
            (f64::from(self.x0), f64::from(self.y1)),
        ];
        let edges = poly.iter().zip(poly.iter().cycle().skip(1));
        let normals = [(1.0, 0.0), (0.0, 1.0)].into_iter().chain(edges.map(|(a, b)| (a.1 - b.1, b.0 - a.0)));
        normals.into_iter().all(|(nx, ny)| {
            let span = |pts: &mut dyn Iterator<Item = &(f64, f64)>| {
                pts.map(|p| p.0 * nx + p.1 * ny)
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
            };
            let (a, b) = (span(&mut poly.iter()), span(&mut corners.iter()));
            a.1 > b.0 && b.1 > a.0
        })
    }

    /// Length of the segment `a → b` inside the box (Liang–Barsky clipping).
    pub fn clipped_length(&self, a: (f64, f64), b: (f64, f64)) -> f64 {
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let (mut t0, mut t1) = (0.0f64, 1.0f64);
        let sides = [
            (-dx, a.0 - f64::from(self.x0)),
            (dx, f64::from(self.x1) - a.0),
            (-dy, a.1 - f64::from(self.y0)),
            (dy, f64::from(self.y1) - a.1),
        ];
        for (p, q) in sides {
            if p == 0.0 {
                if q < 0.0 {
                    return 0.0;
                }
            } else if p < 0.0 {
                t0 = t0.max(q / p);
            } else {
                t1 = t1.min(q / p);
            }
        }
        if t1 > t0 { (t1 - t0) * dx.hypot(dy) } else { 0.0 }
    }
}

/// An arrow as drawn, in pixels: a shaft and a filled head. Drawing and label placement both read
/// it, so labels avoid exactly what is on the page.
pub(super) struct Arrow {
    pub tip: (i32, i32),
    /// The shaft's end points; the same point for a zero-length vector.
    pub shaft: [(i32, i32); 2],
    pub width: u32,
    /// The head's corners, tip first; for a zero-length vector the box of the dot drawn instead.
    pub head: Vec<(i32, i32)>,
}

/// Radius of the dot that stands for a zero-length vector.
pub(super) const DOT: i32 = 4;

impl Arrow {
    /// The arrow from `from` to `to` with a shaft `width` pixels wide.
    pub fn new(from: (i32, i32), to: (i32, i32), width: u32) -> Self {
        let (dx, dy) = (f64::from(to.0 - from.0), f64::from(to.1 - from.1));
        let len = dx.hypot(dy);
        if len < 1.0 {
            let head = vec![
                (to.0 - DOT, to.1 - DOT),
                (to.0 + DOT, to.1 - DOT),
                (to.0 + DOT, to.1 + DOT),
                (to.0 - DOT, to.1 + DOT),
            ];
            return Self { tip: to, shaft: [to, to], width, head };
        }
        let (ux, uy) = (dx / len, dy / len);
        let head = HEAD.min(len * 0.5) + f64::from(width);
        let half = HEAD_HALF + f64::from(width);
        let base = (f64::from(to.0) - ux * head, f64::from(to.1) - uy * head);
        let pt = |x: f64, y: f64| (x.round() as i32, y.round() as i32);
        Self {
            tip: to,
            // One pixel into the head, so no seam shows between them.
            shaft: [from, pt(base.0 + ux, base.1 + uy)],
            width,
            head: vec![
                to,
                pt(base.0 - uy * half, base.1 + ux * half),
                pt(base.0 + uy * half, base.1 - ux * half),
            ],
        }
    }

    pub fn is_dot(&self) -> bool {
        self.shaft[0] == self.shaft[1]
    }
}

/// One line of label text.
#[derive(Clone)]
pub(super) struct Line {
    pub text: String,
    pub style: TextStyle<'static>,
    width: i32,
    height: i32,
}

impl Line {
    pub fn new(text: String, style: TextStyle<'static>) -> Self {
        let (width, height) = measure(&style, &text);
        Self { text, style, width, height }
    }
}

/// One arrow's label: its line and, where it may break, the same text as two lines.
pub(super) struct Label {
    /// The index of its arrow.
    pub arrow: usize,
    pub line: Line,
    pub broken: Option<[Line; 2]>,
}

/// A placed block: the arrows it labels, its box and each line with its top-left corner.
pub(super) struct Block {
    /// Only the tests ask which arrows a block labels.
    #[cfg_attr(not(test), expect(dead_code))]
    pub arrows: Vec<usize>,
    pub rect: Rect,
    pub lines: Vec<(Line, (i32, i32))>,
}

/// The labels of the arrows ending at one point.
struct Group {
    tip: (f64, f64),
    /// Unit vector from the origin out through the tip: beyond the tip is where a label reads best.
    outward: (f64, f64),
    labels: Vec<usize>,
}

/// One way to write a group: its lines and the size of their block.
struct Form {
    lines: Vec<Line>,
    size: (i32, i32),
    /// Extra cost of this form: breaking lines makes a label harder to read.
    cost: f64,
}

/// A block's spot: which form, where.
#[derive(Clone, Copy, PartialEq)]
struct Spot {
    form: usize,
    rect: Rect,
}

/// Places `labels` (in order of importance: the first gets first pick) around the tips of
/// `arrows`, which start at `origin`, with their halos inside `bounds`.
pub(super) fn place(labels: &[Label], arrows: &[Arrow], origin: (i32, i32), bounds: Rect) -> Vec<Block> {
    let groups = group(labels, arrows, origin);
    let forms: Vec<Vec<Form>> = groups.iter().map(|g| forms(g, labels)).collect();
    let spots: Vec<Vec<Spot>> = groups.iter().zip(&forms).map(|(g, f)| candidates(g, f, bounds)).collect();
    let unary: Vec<Vec<f64>> = groups
        .iter()
        .zip(&spots)
        .zip(&forms)
        .map(|((g, s), f)| s.iter().map(|s| alone(g, &f[s.form], s.rect, &groups, arrows)).collect())
        .collect();

    let mut chosen: Vec<Option<usize>> = vec![None; groups.len()];
    // Each move lowers the total cost or keeps it, so this settles; the bound only guards against
    // rounding ping-pong.
    for _ in 0..16 {
        let mut moved = false;
        for g in 0..groups.len() {
            let others: Vec<Rect> = chosen
                .iter()
                .enumerate()
                .filter(|&(o, c)| o != g && c.is_some())
                .filter_map(|(o, c)| c.map(|c| spots[o][c].rect))
                .collect();
            let cost = |s: usize| unary[g][s] + crowding(spots[g][s].rect, &others);
            let best = (0..spots[g].len()).fold(0, |best, s| if cost(s) < cost(best) { s } else { best });
            let improves = chosen[g].is_none_or(|c| cost(best) < cost(c) - 1e-9);
            if improves {
                chosen[g] = Some(best);
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }

    groups
        .iter()
        .zip(chosen)
        .enumerate()
        .map(|(g, (group, c))| {
            let spot = spots[g][c.unwrap_or(0)];
            let arrows = group.labels.iter().map(|&i| labels[i].arrow).collect();
            block(arrows, &forms[g][spot.form], spot.rect, group.tip)
        })
        .collect()
}

/// Gathers labels whose arrows end at one point, in the order of their first label.
fn group(labels: &[Label], arrows: &[Arrow], origin: (i32, i32)) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        let t = arrows[label.arrow].tip;
        let tip = (f64::from(t.0), f64::from(t.1));
        if let Some(g) = groups.iter_mut().find(|g| (g.tip.0 - tip.0).hypot(g.tip.1 - tip.1) < SAME_TIP) {
            g.labels.push(i);
            continue;
        }
        let (dx, dy) = (tip.0 - f64::from(origin.0), tip.1 - f64::from(origin.1));
        let len = dx.hypot(dy);
        // A zero vector has no outward side: up and to the right is as good as any.
        let outward = if len < 1.0 {
            (std::f64::consts::FRAC_1_SQRT_2, -std::f64::consts::FRAC_1_SQRT_2)
        } else {
            (dx / len, dy / len)
        };
        groups.push(Group { tip, outward, labels: vec![i] });
    }
    groups
}

/// A group's forms: every label on one line, and, if any label can break, those broken.
fn forms(group: &Group, labels: &[Label]) -> Vec<Form> {
    let size = |lines: &[Line]| {
        let width = lines.iter().map(|l| l.width).max().unwrap_or(0);
        let height = lines.iter().map(|l| l.height).sum::<i32>() + LINE_GAP * (lines.len() as i32 - 1).max(0);
        (width, height)
    };
    let whole: Vec<Line> = group.labels.iter().map(|&i| labels[i].line.clone()).collect();
    let mut out = vec![Form { size: size(&whole), lines: whole, cost: 0.0 }];
    if group.labels.iter().any(|&i| labels[i].broken.is_some()) {
        let broken: Vec<Line> = group
            .labels
            .iter()
            .flat_map(|&i| match &labels[i].broken {
                Some(two) => two.to_vec(),
                None => vec![labels[i].line.clone()],
            })
            .collect();
        out.push(Form { size: size(&broken), lines: broken, cost: 40.0 });
    }
    out
}

/// Every spot a group's block may take: above, below, left and right of the tip (slid along that
/// side) and at its corners, at a few distances, each moved so its halo is inside `bounds`.
fn candidates(group: &Group, forms: &[Form], bounds: Rect) -> Vec<Spot> {
    let (tx, ty) = group.tip;
    let bounds = Rect {
        x0: bounds.x0 + HALO.0,
        y0: bounds.y0 + HALO.1,
        x1: bounds.x1 - HALO.0,
        y1: bounds.y1 - HALO.1,
    };
    let mut out = Vec::new();
    for (f, form) in forms.iter().enumerate() {
        let (w, h) = (f64::from(form.size.0), f64::from(form.size.1));
        for d in [4.0, 10.0, 18.0, 30.0] {
            let mut corners: Vec<(f64, f64)> = Vec::new();
            for slide in [0.0, 0.25, 0.5, 0.75, 1.0] {
                corners.push((tx - slide * w, ty - d - h));
                corners.push((tx - slide * w, ty + d));
            }
            for slide in [0.0, 0.5, 1.0] {
                corners.push((tx + d, ty - slide * h));
                corners.push((tx - d - w, ty - slide * h));
            }
            let c = d * std::f64::consts::FRAC_1_SQRT_2;
            corners.extend([
                (tx + c, ty - c - h),
                (tx - c - w, ty - c - h),
                (tx + c, ty + c),
                (tx - c - w, ty + c),
            ]);
            for (x, y) in corners {
                let (x0, y0) = (x.round() as i32, y.round() as i32);
                let rect = Rect { x0, y0, x1: x0 + form.size.0, y1: y0 + form.size.1 }.moved_into(&bounds);
                let spot = Spot { form: f, rect };
                if !out.contains(&spot) {
                    out.push(spot);
                }
            }
        }
    }
    out
}

/// A spot's cost on its own (everything but the other labels): what it covers, how far it sits
/// from its tip, whether it sits nearer another tip.
fn alone(group: &Group, form: &Form, rect: Rect, groups: &[Group], arrows: &[Arrow]) -> f64 {
    let halo = rect.halo();
    let mut cost = form.cost;
    for arrow in arrows {
        let head: Vec<(f64, f64)> = arrow.head.iter().map(|&(x, y)| (f64::from(x), f64::from(y))).collect();
        // A covered arrowhead hides where a vector ends: hardly better than overlapping labels.
        if halo.grown(1).meets_polygon(&head) {
            cost += 5_000.0;
        }
        if !arrow.is_dot() {
            let [a, b] = arrow.shaft.map(|(x, y)| (f64::from(x), f64::from(y)));
            let reach = halo.grown(1 + (arrow.width / 2) as i32);
            cost += 40.0 * reach.clipped_length(a, b);
        }
    }
    let own = rect.distance_to(group.tip);
    cost += 3.0 * own;
    // A label that sits nearer another tip reads as that arrow's label.
    for other in groups {
        let clearance = rect.distance_to(other.tip) - own;
        if other.tip != group.tip && clearance < 16.0 {
            cost += 60.0 * (16.0 - clearance);
        }
    }
    let (cx, cy) = rect.centre();
    let (vx, vy) = (cx - group.tip.0, cy - group.tip.1);
    let len = vx.hypot(vy).max(1.0);
    cost + 25.0 * (1.0 - (vx * group.outward.0 + vy * group.outward.1) / len)
}

/// The cost of `rect` overlapping labels already placed, halos and a little air included.
fn crowding(rect: Rect, others: &[Rect]) -> f64 {
    let mine = rect.halo().grown(GAP / 3);
    others
        .iter()
        .filter(|o| mine.overlaps(&o.halo()))
        .map(|o| {
            let o = o.halo();
            let w = mine.x1.min(o.x1) - mine.x0.max(o.x0);
            let h = mine.y1.min(o.y1) - mine.y0.max(o.y0);
            20_000.0 + f64::from(w * h)
        })
        .sum()
}

/// The block of `form` at `rect`, its lines aligned toward the tip.
fn block(arrows: Vec<usize>, form: &Form, rect: Rect, tip: (f64, f64)) -> Block {
    let quarter = f64::from(rect.x1 - rect.x0) / 4.0;
    let mut y = rect.y0;
    let lines = form
        .lines
        .iter()
        .map(|line| {
            let x = if tip.0 <= f64::from(rect.x0) + quarter {
                rect.x0
            } else if tip.0 >= f64::from(rect.x1) - quarter {
                rect.x1 - line.width
            } else {
                rect.x0 + (rect.x1 - rect.x0 - line.width) / 2
            };
            let at = (x, y);
            y += line.height + LINE_GAP;
            (line.clone(), at)
        })
        .collect();
    Block { arrows, rect, lines }
}
