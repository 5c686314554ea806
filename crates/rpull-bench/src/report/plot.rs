//! `--plot FILE.svg`: two panels of horizontal bars side by side. Left, each stage alone as MB/s
//! (longer is faster); right, whole pulls (rpull end to end, then each peer) as seconds with
//! their min-max range and the pipeline floor (shorter is faster).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{rate, seconds};
use crate::BenchReport;
use crate::error::BenchError;

const WIDTH: u32 = 1400;
const ROW: i32 = 34;
const TOP: i32 = 84;
const LABEL_WIDTH: i32 = 190;
const VALUE_ROOM: i32 = 230;
const FONT: &str = "sans-serif";

const NETWORK: RGBColor = RGBColor(52, 101, 164);
const DECOMPRESS: RGBColor = RGBColor(230, 140, 30);
const EXTRACT: RGBColor = RGBColor(78, 154, 6);
const PULL: RGBColor = RGBColor(117, 80, 123);
const PEER: RGBColor = RGBColor(136, 138, 133);
const MUTED: RGBColor = RGBColor(110, 110, 110);

/// One bar: its label, length, optional min-max whisker, and the text after it.
struct Bar {
    label: String,
    value: Option<f64>,
    range: Option<(f64, f64)>,
    text: String,
    color: RGBColor,
}

fn stage_color(stage: &str) -> RGBColor {
    match stage.split('-').next() {
        Some("network") => NETWORK,
        Some("decompress") => DECOMPRESS,
        Some("extract") => EXTRACT,
        _ => PULL,
    }
}

fn stage_bars(report: &BenchReport) -> Vec<Bar> {
    report
        .stages
        .iter()
        .map(|stage| {
            let text = match (stage.mb_per_s_in, stage.mb_per_s_out, stage.files_per_s) {
                (None, _, _) => stage
                    .notes
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "no number".to_owned()),
                (Some(i), Some(o), Some(f)) => {
                    format!("{} MB/s in, {} out, {} files/s", rate(i), rate(o), rate(f))
                }
                (Some(i), Some(o), None) => format!("{} MB/s in, {} out", rate(i), rate(o)),
                (Some(i), None, _) => format!("{} MB/s", rate(i)),
            };
            Bar {
                label: stage.stage.clone(),
                value: stage.mb_per_s_in,
                range: None,
                text,
                color: stage_color(&stage.stage),
            }
        })
        .collect()
}

fn pull_bars(report: &BenchReport) -> Vec<Bar> {
    let mut bars = Vec::new();
    if let Some(stage) = report.stages.iter().find(|s| s.stage == "end-to-end") {
        bars.push(Bar {
            label: "rpull pull".to_owned(),
            value: stage.seconds.map(|s| s.median),
            range: stage.seconds.map(|s| (s.min, s.max)),
            text: stage
                .seconds
                .map(|s| format!("{} s", seconds(s.median)))
                .unwrap_or_else(|| "no number".to_owned()),
            color: PULL,
        });
    }
    for peer in &report.peers {
        let text = match (&peer.seconds, &peer.skipped) {
            (Some(s), _) => format!("{} s", seconds(s.median)),
            (None, Some(reason)) => format!("no number: {reason}"),
            (None, None) => "no number".to_owned(),
        };
        bars.push(Bar {
            label: peer.tool.clone(),
            value: peer.seconds.map(|s| s.median),
            range: peer.seconds.map(|s| (s.min, s.max)),
            text,
            color: PEER,
        });
    }
    bars
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn clip(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        text.chars().take(chars - 1).collect::<String>() + "…"
    }
}

/// Draws `bars` scaled to the panel; `marker` is a labelled vertical line (the floor).
fn panel(
    area: &Area<'_>,
    title: &str,
    subtitle: &str,
    bars: &[Bar],
    marker: Option<(f64, String)>,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let (width, _) = area.dim_in_pixel();
    let width = width as i32;
    let title_style = (FONT, 20).into_font().style(FontStyle::Bold).color(&BLACK);
    area.draw(&Text::new(title.to_owned(), (16, 14), title_style))
        .map_err(err)?;
    area.draw(&Text::new(
        subtitle.to_owned(),
        (16, 42),
        (FONT, 14).into_font().color(&MUTED),
    ))
    .map_err(err)?;
    let x0 = LABEL_WIDTH;
    let span = (width - x0 - VALUE_ROOM).max(50);
    let max = bars
        .iter()
        .flat_map(|b| [b.value, b.range.map(|r| r.1)])
        .flatten()
        .chain(marker.as_ref().map(|m| m.0))
        .fold(0.0f64, f64::max);
    let scale = |v: f64| {
        if max > 0.0 {
            x0 + ((v / max) * span as f64).round() as i32
        } else {
            x0
        }
    };
    let label_style = (FONT, 15)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    let value_style = (FONT, 14)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let missing_style = (FONT, 14)
        .into_font()
        .style(FontStyle::Italic)
        .color(&MUTED)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, bar) in bars.iter().enumerate() {
        let y = TOP + i as i32 * ROW;
        let mid = y + ROW / 2;
        area.draw(&Text::new(
            clip(&bar.label, 22),
            (x0 - 10, mid),
            label_style.clone(),
        ))
        .map_err(err)?;
        match bar.value {
            Some(value) => {
                let x1 = scale(value).max(x0 + 2);
                area.draw(&Rectangle::new(
                    [(x0, y + 5), (x1, y + ROW - 5)],
                    bar.color.filled(),
                ))
                .map_err(err)?;
                let mut text_x = x1 + 8;
                if let Some((low, high)) = bar.range {
                    let (a, b) = (scale(low), scale(high));
                    let whisker = BLACK.stroke_width(2);
                    area.draw(&PathElement::new(vec![(a, mid), (b, mid)], whisker))
                        .map_err(err)?;
                    for x in [a, b] {
                        area.draw(&PathElement::new(vec![(x, mid - 6), (x, mid + 6)], whisker))
                            .map_err(err)?;
                    }
                    text_x = text_x.max(b + 8);
                }
                area.draw(&Text::new(
                    clip(&bar.text, 48),
                    (text_x, mid),
                    value_style.clone(),
                ))
                .map_err(err)?;
            }
            None => {
                area.draw(&Text::new(
                    clip(&bar.text, 70),
                    (x0 + 4, mid),
                    missing_style.clone(),
                ))
                .map_err(err)?;
            }
        }
    }
    let bottom = TOP + bars.len() as i32 * ROW;
    area.draw(&PathElement::new(
        vec![(x0, TOP - 4), (x0, bottom + 4)],
        BLACK.stroke_width(1),
    ))
    .map_err(err)?;
    if let Some((value, label)) = marker {
        let x = scale(value);
        let red = RGBColor(204, 0, 0);
        let mut y = TOP - 4;
        while y < bottom + 4 {
            area.draw(&PathElement::new(
                vec![(x, y), (x, (y + 6).min(bottom + 4))],
                red.stroke_width(2),
            ))
            .map_err(err)?;
            y += 10;
        }
        let style = (FONT, 13)
            .into_font()
            .color(&red)
            .pos(Pos::new(HPos::Center, VPos::Top));
        area.draw(&Text::new(label, (x, bottom + 8), style))
            .map_err(err)?;
    }
    Ok(())
}

/// The chart as SVG text.
pub fn render_svg(report: &BenchReport) -> Result<String, String> {
    let stages = stage_bars(report);
    let pulls = pull_bars(report);
    let rows = stages.len().max(pulls.len()).max(1) as i32;
    let height = (TOP + rows * ROW + 90) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(WIDTH / 2);
        panel(
            &left,
            "Each stage alone",
            "MB/s in (median; compressed bytes, tar bytes for extract) — longer is faster",
            &stages,
            None,
        )?;
        let floor = report
            .pipeline_floor_seconds
            .map(|f| (f, format!("pipeline floor {} s", seconds(f))));
        panel(
            &right,
            "Whole pull",
            "seconds (median, whisker min–max) — shorter is faster",
            &pulls,
            floor,
        )?;
        let footer = format!(
            "{} — {} layers, {:.1} MB compressed, {:.1} MB tar, {} entries; {} run(s); {} cpus; destination {} ({})",
            report.reference,
            report.layers,
            report.compressed_bytes as f64 / 1e6,
            report.uncompressed_bytes as f64 / 1e6,
            report.entries,
            report.runs,
            report.machine.cpus,
            report.destination,
            report.machine.destination_fs.as_deref().unwrap_or("?"),
        );
        let style = (FONT, 13).into_font().color(&MUTED);
        root.draw(&Text::new(
            clip(&footer, 190),
            (16, height as i32 - 30),
            style,
        ))
        .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Writes the chart to `path`.
pub fn write_svg(report: &BenchReport, path: &Path) -> Result<(), BenchError> {
    let svg = render_svg(report)
        .map_err(|e| BenchError::Invalid(format!("drawing {}: {e}", path.display())))?;
    fs_err::write(path, svg).map_err(|e| BenchError::io("writing", path, e))
}
