//! Small SVG plots drawn on the server (no script, no font files): a bar histogram, a log-log
//! scatter with a diagonal, and points against a log2 x axis with a horizontal roofline.

use maud::{html, Markup};

const W: f64 = 410.0;
const H: f64 = 270.0;
const LEFT: f64 = 62.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 44.0;

/// One colour per series, in order.
pub const COLOURS: [&str; 6] = [
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
];

#[derive(Clone, Copy)]
enum Scale {
    Linear,
    Log10,
    Log2,
}

#[derive(Clone, Copy)]
struct Axis {
    lo: f64,
    hi: f64,
    scale: Scale,
    px_lo: f64,
    px_hi: f64,
}

impl Axis {
    fn t(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => v,
            Scale::Log10 => v.log10(),
            Scale::Log2 => v.log2(),
        }
    }
    fn px(&self, v: f64) -> f64 {
        let (a, b) = (self.t(self.lo), self.t(self.hi));
        let f = if b > a {
            (self.t(v) - a) / (b - a)
        } else {
            0.5
        };
        self.px_lo + f.clamp(0.0, 1.0) * (self.px_hi - self.px_lo)
    }
    fn ticks(&self) -> Vec<(f64, String)> {
        match self.scale {
            Scale::Linear => {
                let step = nice_step((self.hi - self.lo) / 5.0);
                let mut v = (self.lo / step).ceil() * step;
                let mut out = Vec::new();
                while v <= self.hi + step * 1e-9 {
                    out.push((v, short_num(v)));
                    v += step;
                }
                out
            }
            Scale::Log10 => {
                let (a, b) = (
                    exponent(self.lo.log10().floor()),
                    exponent(self.hi.log10().ceil()),
                );
                let every = (b.saturating_sub(a) / 6).max(1);
                (a..=b)
                    .filter(|e| (e - a) % every == 0)
                    .map(|e| (10f64.powi(e), format!("1e{e}")))
                    .filter(|(v, _)| *v >= self.lo * 0.999 && *v <= self.hi * 1.001)
                    .collect()
            }
            Scale::Log2 => {
                let (a, b) = (
                    exponent(self.lo.log2().floor()),
                    exponent(self.hi.log2().ceil()),
                );
                let every = (b.saturating_sub(a) / 7).max(1);
                (a..=b)
                    .filter(|e| (e - a) % every == 0)
                    .map(|e| (2f64.powi(e), short_num(2f64.powi(e))))
                    .filter(|(v, _)| *v >= self.lo * 0.999 && *v <= self.hi * 1.001)
                    .collect()
            }
        }
    }
}

/// A tick exponent, bounded: a zero or subnormal bound (an error of 1e-320 in a real report)
/// has a logarithm of -inf or near it, which must not wrap.
fn exponent(e: f64) -> i32 {
    if e.is_nan() {
        0
    } else {
        e.clamp(-300.0, 300.0) as i32
    }
}

fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let n = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * p
}

/// A count short enough to sit over a bar: 812, 24k, 2.4e8.
fn count_label(n: u64) -> String {
    if n < 10_000 {
        n.to_string()
    } else if n < 1_000_000 {
        format!("{}k", n / 1000)
    } else {
        format!("{:.1e}", n as f64)
    }
}

fn short_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 10_000.0 && v % 1024.0 == 0.0 {
        format!("{}k", v as u64 / 1024)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn frame(
    title: &str,
    x: Option<&Axis>,
    y: &Axis,
    x_label: &str,
    y_label: &str,
    inner: Markup,
) -> Markup {
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={"0 0 " (W) " " (H)} width=(W) height=(H)
            role="img" aria-label=(title) class="plot" {
            title { (title) }
            rect x=(LEFT) y=(TOP) width=(W - LEFT - RIGHT) height=(H - TOP - BOTTOM) fill="#fff" stroke="#c4cad1" {}
            @for (v, label) in y.ticks() {
                @let py = y.px(v);
                line x1=(LEFT) x2=(W - RIGHT) y1=(py) y2=(py) stroke="#eef0f3" {}
                text x=(LEFT - 5.0) y=(py + 4.0) font-size="10" text-anchor="end" fill="#444" { (label) }
            }
            @for (v, label) in x.map(Axis::ticks).unwrap_or_default() {
                @let x = x.expect("ticks come from x");
                @let px = x.px(v);
                line x1=(px) x2=(px) y1=(H - BOTTOM) y2=(H - BOTTOM + 4.0) stroke="#888" {}
                text x=(px) y=(H - BOTTOM + 15.0) font-size="10" text-anchor="middle" fill="#444" { (label) }
            }
            text x=((LEFT + W - RIGHT) / 2.0) y=(H - 8.0) font-size="11" text-anchor="middle" fill="#222" { (x_label) }
            text x="12" y=((TOP + H - BOTTOM) / 2.0) font-size="11" text-anchor="middle" fill="#222"
                transform={"rotate(-90 12 " ((TOP + H - BOTTOM) / 2.0) ")"} { (y_label) }
            (inner)
        }
    }
}

/// Bars of `counts` (log scale, so a few 1-ulp elements next to millions of exact ones show).
pub fn histogram(title: &str, labels: &[String], counts: &[u64]) -> Markup {
    let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let y = Axis {
        lo: 1.0,
        hi: 10f64.powf(max.log10().ceil().max(1.0)),
        scale: Scale::Log10,
        px_lo: H - BOTTOM,
        px_hi: TOP,
    };
    let n = labels.len().max(1) as f64;
    let slot = (W - LEFT - RIGHT) / n;
    let inner = html! {
        @for (i, (label, count)) in labels.iter().zip(counts).enumerate() {
            @let x0 = LEFT + slot * i as f64;
            @let top = if *count == 0 { H - BOTTOM } else { y.px((*count as f64).max(1.0)).min(H - BOTTOM - 2.0) };
            @if *count > 0 {
                rect x=(x0 + slot * 0.15) y=(top) width=(slot * 0.7) height=(H - BOTTOM - top)
                    fill=(if i == 0 { "#16a34a" } else { "#dc2626" }) {
                    title { (label) " ulp: " (count) " elements" }
                }
                text x=(x0 + slot / 2.0) y=(top - 3.0) font-size="9" text-anchor="middle" fill="#222" { (count_label(*count)) }
            }
            text x=(x0 + slot / 2.0) y=(H - BOTTOM + 15.0) font-size="10" text-anchor="middle" fill="#444" { (label) }
        }
    };
    frame(
        title,
        None,
        &y,
        "ulp distance to the reference",
        "elements (log)",
        inner,
    )
}

/// A labelled point of a scatter plot; `series` indexes `COLOURS`.
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub series: usize,
    pub label: String,
}

fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (1e-8, 1.0);
    }
    // Subnormal values are drawn at 1e-300: 10^-324 would round to zero.
    let (a, b) = (
        lo.log10().floor().max(-300.0),
        hi.log10().ceil().max(-299.0),
    );
    (10f64.powf(a), 10f64.powf(b.max(a + 1.0)))
}

/// Candidate error (y) against reference error (x), both vs the f64 oracle, log-log, with
/// y = x drawn: points under the line are closer to the truth than the reference. Zeros are
/// drawn at the lower edge.
pub fn error_scatter(title: &str, points: &[Point], series: &[String]) -> Markup {
    let (lo, hi) = log_range(points.iter().flat_map(|p| [p.x, p.y]));
    let x = Axis {
        lo,
        hi,
        scale: Scale::Log10,
        px_lo: LEFT,
        px_hi: W - RIGHT,
    };
    let y = Axis {
        lo,
        hi,
        scale: Scale::Log10,
        px_lo: H - BOTTOM,
        px_hi: TOP,
    };
    let inner = html! {
        line x1=(x.px(lo)) y1=(y.px(lo)) x2=(x.px(hi)) y2=(y.px(hi)) stroke="#888" stroke-dasharray="4 3" {}
        text x=(x.px(hi) - 4.0) y=(y.px(hi) + 12.0) font-size="10" text-anchor="end" fill="#666" { "candidate = reference" }
        @for p in points {
            circle cx=(x.px(p.x.max(lo))) cy=(y.px(p.y.max(lo))) r="3.5" fill=(COLOURS[p.series % COLOURS.len()]) fill-opacity="0.75" {
                title { (p.label) }
            }
        }
        (legend(series))
    };
    frame(
        title,
        Some(&x),
        &y,
        "reference max abs error vs f64 oracle",
        "candidate max abs error",
        inner,
    )
}

/// GB/s (y) against cols (x, log2) with the copy-bandwidth roofline as a dashed line.
pub fn speed_vs_cols(
    title: &str,
    points: &[Point],
    series: &[String],
    roofline_gbps: f64,
) -> Markup {
    let (mut xlo, mut xhi) = (f64::INFINITY, f64::NEG_INFINITY);
    for p in points {
        xlo = xlo.min(p.x);
        xhi = xhi.max(p.x);
    }
    if !xlo.is_finite() {
        (xlo, xhi) = (64.0, 65536.0);
    }
    let x = Axis {
        lo: 2f64.powf(xlo.max(1.0).log2().floor()),
        hi: 2f64.powf(
            xhi.max(2.0)
                .log2()
                .ceil()
                .max(xlo.max(1.0).log2().floor() + 1.0),
        ),
        scale: Scale::Log2,
        px_lo: LEFT,
        px_hi: W - RIGHT,
    };
    let ymax = points.iter().map(|p| p.y).fold(roofline_gbps, f64::max) * 1.1;
    let y = Axis {
        lo: 0.0,
        hi: ymax.max(1.0),
        scale: Scale::Linear,
        px_lo: H - BOTTOM,
        px_hi: TOP,
    };
    let inner = html! {
        @if roofline_gbps > 0.0 {
            line.roofline x1=(LEFT) x2=(W - RIGHT) y1=(y.px(roofline_gbps)) y2=(y.px(roofline_gbps)) stroke="#111" stroke-width="1.5" stroke-dasharray="6 4" {}
            text x=(W - RIGHT - 4.0) y=(y.px(roofline_gbps) - 4.0) font-size="10" text-anchor="end" fill="#111" {
                "copy bandwidth (roofline) " (format!("{roofline_gbps:.0}")) " GB/s"
            }
        }
        @for p in points {
            circle cx=(x.px(p.x)) cy=(y.px(p.y)) r="3.5" fill=(COLOURS[p.series % COLOURS.len()]) fill-opacity="0.75" {
                title { (p.label) }
            }
        }
        (legend(series))
    };
    frame(title, Some(&x), &y, "cols (log2)", "GB/s", inner)
}

fn legend(series: &[String]) -> Markup {
    html! {
        @for (i, s) in series.iter().enumerate() {
            rect x=(LEFT + 8.0) y=(TOP + 6.0 + 14.0 * i as f64) width="9" height="9" fill=(COLOURS[i % COLOURS.len()]) {}
            text x=(LEFT + 21.0) y=(TOP + 14.0 + 14.0 * i as f64) font-size="10" fill="#222" { (s) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(x: f64, y: f64) -> Point {
        Point {
            x,
            y,
            series: 0,
            label: format!("{x} {y}"),
        }
    }

    /// The y pixel of the roofline's `<line>` in an SVG.
    fn roofline_y(svg: &str) -> f64 {
        let at = svg.find("class=\"roofline\"").expect("a roofline");
        let y1 = svg[at..].find("y1=\"").unwrap() + at + 4;
        svg[y1..y1 + svg[y1..].find('"').unwrap()].parse().unwrap()
    }

    /// Errors of a real H200 report reach subnormals (4.9e-324): the plot draws them at its
    /// lower edge instead of panicking on an exponent that wraps.
    #[test]
    fn subnormal_and_zero_errors_are_drawn() {
        let pts = [
            point(f64::from_bits(1), 1e-3),
            point(0.0, 2e-310),
            point(1e-2, 0.0),
        ];
        let svg = error_scatter("t", &pts, &["bf16".into()]).into_string();
        assert!(svg.contains("<svg"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        assert_eq!(exponent(f64::NEG_INFINITY), -300);
        assert_eq!(exponent(f64::NAN), 0);
    }

    #[test]
    fn roofline_sits_above_slower_points_and_scales_with_bandwidth() {
        let pts = [point(64.0, 500.0), point(8192.0, 3000.0)];
        let svg = speed_vs_cols("t", &pts, &["bf16".into()], 4000.0).into_string();
        let cys = |svg: &str| -> Vec<f64> {
            svg.match_indices("cy=\"")
                .map(|(i, _)| {
                    let s = &svg[i + 4..];
                    s[..s.find('"').unwrap()].parse().unwrap()
                })
                .collect()
        };
        let cy = cys(&svg);
        assert_eq!(cy.len(), 2);
        let roof = roofline_y(&svg);
        // SVG y grows downwards: faster is higher, the roofline highest.
        assert!(roof < cy[1] && cy[1] < cy[0], "{roof} {cy:?}");
        let higher = speed_vs_cols("t", &pts, &["bf16".into()], 8000.0).into_string();
        // Against a roofline twice as high, the same speed sits lower.
        assert!(cys(&higher)[1] > cy[1]);
        assert!(roofline_y(&higher) < cys(&higher)[1]);
        assert!(svg.contains("copy bandwidth (roofline) 4000 GB/s"));
    }

    #[test]
    fn histogram_draws_only_non_empty_buckets_and_escapes_labels() {
        let labels: Vec<String> = ["0", "1", "<2>"].iter().map(|s| s.to_string()).collect();
        let svg = histogram("h", &labels, &[1_000_000, 3, 0]).into_string();
        assert_eq!(svg.matches("<rect").count(), 1 + 2, "frame + two bars");
        assert!(svg.contains("1.0e6") && svg.contains(">3<"));
        assert!(svg.contains("&lt;2&gt;") && !svg.contains("<2>"));
    }

    #[test]
    fn zero_errors_are_drawn_on_the_axis_not_dropped() {
        let svg = error_scatter("e", &[point(0.0, 0.0), point(1e-3, 2e-3)], &[]).into_string();
        assert_eq!(svg.matches("<circle").count(), 2);
    }
}
