//! `memory.png`: reserved and allocated bytes over time, one panel per policy, with the
//! phase boundaries the sampler saw marked as vertical lines. Text is drawn with an 8×8
//! bitmap font, so the plot needs no system fonts.

use std::path::Path;

use font8x8::UnicodeFonts;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters_bitmap::BitMapBackendError;

use crate::{BenchError, Result};

/// One policy's curves.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    /// Title of the panel (the policy).
    pub label: String,
    /// (x, allocated bytes, reserved bytes), in order.
    pub points: Vec<(f64, u64, u64)>,
    /// (x, phase name) of every boundary crossed.
    pub marks: Vec<(f64, String)>,
}

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Seconds of wall time.
    Seconds,
    /// Allocator events (meta execution has no wall time).
    Events,
}

const WIDTH: u32 = 1200;
const PANEL_HEIGHT: u32 = 240;
const HEADER: u32 = 44;
const RESERVED: RGBColor = RGBColor(31, 119, 180);
const ALLOCATED: RGBColor = RGBColor(214, 39, 40);
const DECODE: RGBColor = RGBColor(255, 190, 90);
const SESSION: RGBColor = RGBColor(120, 120, 120);
const OTHER: RGBColor = RGBColor(60, 60, 60);
const GRID: RGBColor = RGBColor(225, 225, 225);

fn mark_color(phase: &str) -> Option<RGBColor> {
    match phase {
        "decode_start" => Some(DECODE),
        "session_end" => Some(SESSION),
        // Denoise ends right before the decode starts: one line is enough.
        "denoise_end" => None,
        _ => Some(OTHER),
    }
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Io {
        path: path.to_path_buf(),
        message: format!("drawing the memory plot: {e}"),
    }
}

/// Draws `text` with its top-left corner at `(x, y)` (pixels), each font pixel a
/// `scale`×`scale` square.
fn text(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    s: &str,
    (x, y): (i32, i32),
    color: RGBColor,
    scale: i32,
) {
    for (i, c) in s.chars().enumerate() {
        let Some(glyph) = font8x8::BASIC_FONTS.get(c) else {
            continue;
        };
        let left = x + i as i32 * 8 * scale;
        for (row, bits) in glyph.iter().enumerate() {
            for col in (0..8).filter(|col| bits & (1 << col) != 0) {
                let (px, py) = (left + col * scale, y + row as i32 * scale);
                // A filled rectangle of one pixel draws nothing, so set the pixels.
                for (dx, dy) in (0..scale).flat_map(|dx| (0..scale).map(move |dy| (dx, dy))) {
                    let _ = area.draw_pixel((px + dx, py + dy), &color);
                }
            }
        }
    }
}

/// Width in pixels of `s` drawn at `scale`.
fn text_width(s: &str, scale: i32) -> i32 {
    s.chars().count() as i32 * 8 * scale
}

/// A round step giving about `target` ticks over `0..max`.
fn tick_step(max: f64, target: f64) -> f64 {
    let raw = (max / target).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * magnitude)
}

/// Writes the panels to a PNG at `path`, with `note` under the legend.
pub fn write_memory_png(path: &Path, panels: &[Panel], axis: XAxis, note: &str) -> Result<()> {
    let height = HEADER + PANEL_HEIGHT * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    text(&root, "Memory over time (MiB):", (10, 8), BLACK, 2);
    let mut x = 10 + text_width("Memory over time (MiB): ", 2);
    for (label, color) in [
        ("reserved", RESERVED),
        ("allocated", ALLOCATED),
        ("| decode_start", DECODE),
        ("| session_end", SESSION),
    ] {
        text(&root, label, (x, 8), color, 2);
        x += text_width(label, 2) + 24;
    }
    text(&root, note, (10, 28), OTHER, 1);
    let body = root.margin(HEADER, 0, 0, 0);
    let areas = body.split_evenly((panels.len().max(1), 1));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(&root, area, panel, axis).map_err(|e| plot_err(path, e))?;
    }
    root.present().map_err(|e| plot_err(path, e))?;
    Ok(())
}

fn draw_panel(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    panel: &Panel,
    axis: XAxis,
) -> std::result::Result<(), DrawingAreaErrorKind<BitMapBackendError>> {
    const MIB: f64 = (1u64 << 20) as f64;
    let x_max = panel
        .points
        .iter()
        .map(|p| p.0)
        .chain(panel.marks.iter().map(|m| m.0))
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let y_max = panel
        .points
        .iter()
        .map(|p| p.2.max(p.1) as f64 / MIB)
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.12;
    let chart = ChartBuilder::on(area)
        .margin_left(80)
        .margin_right(20)
        .margin_top(22)
        .margin_bottom(30)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    let plot = chart.plotting_area();
    let (px, py) = plot.get_pixel_range();
    let to_px = |x: f64, y: f64| plot.map_coordinate(&(x, y));
    // Grid and tick labels.
    let y_step = tick_step(y_max, 5.0);
    let mut y = 0.0;
    while y <= y_max {
        plot.draw(&PathElement::new(vec![(0.0, y), (x_max, y)], GRID))?;
        let (_, yp) = to_px(0.0, y);
        let label = format!("{y:.0}");
        text(
            root,
            &label,
            (px.start - 6 - text_width(&label, 1), yp - 4),
            OTHER,
            1,
        );
        y += y_step;
    }
    let x_step = tick_step(x_max, 10.0);
    let mut x = 0.0;
    while x <= x_max {
        let (xp, _) = to_px(x, 0.0);
        let label = match axis {
            // As many decimals as the step needs, so neighbouring ticks differ.
            XAxis::Seconds => {
                let decimals = (-x_step.log10()).ceil().max(0.0) as usize;
                format!("{x:.decimals$}s")
            }
            XAxis::Events if x_step >= 1000.0 => format!("{:.0}k", x / 1000.0),
            XAxis::Events => format!("{x:.0}"),
        };
        text(
            root,
            &label,
            (xp - text_width(&label, 1) / 2, py.end + 6),
            OTHER,
            1,
        );
        x += x_step;
    }
    for (t, phase) in &panel.marks {
        if let Some(color) = mark_color(phase) {
            plot.draw(&PathElement::new(vec![(*t, 0.0), (*t, y_max)], color))?;
        }
    }
    let curve = |f: fn(&(f64, u64, u64)) -> u64| {
        panel
            .points
            .iter()
            .map(move |p| (p.0, f(p) as f64 / MIB))
            .collect::<Vec<_>>()
    };
    plot.draw(&PathElement::new(curve(|p| p.2), RESERVED.stroke_width(1)))?;
    plot.draw(&PathElement::new(curve(|p| p.1), ALLOCATED.stroke_width(1)))?;
    plot.draw(&Rectangle::new([(0.0, 0.0), (x_max, y_max)], OTHER))?;
    text(root, &panel.label, (px.start, py.start - 16), BLACK, 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(600.0, 5.0), 200.0);
        assert_eq!(tick_step(23.5, 10.0), 5.0);
        assert_eq!(tick_step(0.8, 10.0), 0.1);
    }

    #[test]
    fn the_plot_is_a_png_with_a_panel_per_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.png");
        let panel = |label: &str| Panel {
            label: label.to_string(),
            points: (0..100)
                .map(|i| (i as f64 * 0.1, (i % 10) << 20, 12 << 20))
                .collect(),
            marks: vec![(2.0, "decode_start".into()), (9.0, "session_end".into())],
        };
        write_memory_png(
            &path,
            &[panel("never"), panel("fit")],
            XAxis::Seconds,
            "test",
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // IHDR: width and height, big-endian, right after the chunk header.
        let be = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        assert_eq!(&bytes[12..16], b"IHDR");
        assert_eq!(be(16), WIDTH);
        assert_eq!(be(20), HEADER + 2 * PANEL_HEIGHT);
    }
}
