//! The status page: the fleet rendered on the server, and a little JavaScript (`page.js`) that
//! renders the same markup from `/api/v1/status` every few seconds.
//!
//! Both renderers write the same `data-*` attributes (runner, shape, instance, slot, job), which
//! is what tests compare with the API.

use std::fmt::Write as _;

use crate::format::{bytes, duration, money};
use crate::model::{
    FleetStatus, HistorySeries, InstanceStatus, PendingJob, RunnerStatus, ShapeStatus,
};

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The whole page for `status`; the script refreshes it every `refresh_ms`.
pub fn render(status: &FleetStatus, refresh_ms: u64) -> String {
    let mut h = String::with_capacity(16 * 1024);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Slipway status</title><style>{STYLE}</style></head>\n\
         <body data-refreshes=\"0\" data-generated=\"{}\" data-refresh-ms=\"{refresh_ms}\">\n\
         <header><h1>Slipway</h1><span id=\"summary\">{}</span>\
         <span id=\"updated\">version {} · up {}</span></header>\n",
        status.generated_at_ms,
        esc(&summary_line(status)),
        esc(&status.version),
        duration(status.uptime_s),
    );
    h.push_str("<section id=\"charts\">");
    charts(&mut h, &status.history);
    h.push_str("</section>\n<main id=\"fleet\">");
    fleet(&mut h, status);
    let _ = write!(h, "</main>\n<script>{SCRIPT}</script>\n</body></html>\n");
    h
}

/// `3 instances · 2 ready · 4/8 slots busy · 1 pending` (`· 5 queued` with a queue).
pub fn summary_line(s: &FleetStatus) -> String {
    let t = s.totals();
    let mut line = format!(
        "{} instances · {} ready · {}/{} slots busy · {} pending",
        t.instances,
        t.ready,
        t.busy_slots,
        t.busy_slots + t.idle_slots,
        t.pending
    );
    if let Some(q) = &s.queue {
        let _ = write!(line, " · {} queued", q.pending);
    }
    line
}

/// The fleet section's inner markup (what `page.js` replaces on refresh).
pub fn fleet(h: &mut String, s: &FleetStatus) {
    if let Some(q) = &s.queue {
        let _ = write!(
            h,
            "<section class=\"queue\" data-queued=\"{n}\"><h2>Queue <small>{n} jobs waiting for a \
             runner</small></h2>",
            n = q.pending
        );
        if !q.jobs.is_empty() {
            waiting_table(h, "queued", &q.jobs, false);
        }
        h.push_str("</section>");
    }
    if s.runners.is_empty() {
        h.push_str("<p class=\"empty\">No runners.</p>");
    }
    for r in &s.runners {
        runner(h, r);
    }
}

fn runner(h: &mut String, r: &RunnerStatus) {
    let t = &r.totals;
    let _ = write!(
        h,
        "<section class=\"runner\" data-runner=\"{n}\"><h2>{n} <small>{e}</small></h2>\
         <p class=\"totals\">{} instances · {} ready · {}/{} slots busy · {} running · {} pending</p>",
        t.instances,
        t.ready,
        t.busy_slots,
        t.busy_slots + t.idle_slots,
        t.running,
        t.pending,
        n = esc(&r.name),
        e = esc(&r.executor),
    );
    if let Some(c) = &r.costs {
        let _ = write!(
            h,
            "<p class=\"costs\">Cost: <b>{}</b> per hour now · {} billed · {} to jobs · {} overhead \
             ({}%)</p>",
            esc(&money(c.per_hour, &c.currency)),
            esc(&money(c.billed, &c.currency)),
            esc(&money(c.jobs, &c.currency)),
            esc(&money(c.overhead, &c.currency)),
            (c.overhead_share() * 100.0).round(),
        );
        if !c.unpriced.is_empty() {
            let _ = write!(
                h,
                "<p class=\"unpriced\">Cost unknown for shapes without a price: {}.</p>",
                esc(&c.unpriced.join(", "))
            );
        }
    }
    if !r.vm_starts.is_empty() {
        h.push_str("<p class=\"vm-starts\">VM starts:");
        for (i, v) in r.vm_starts.iter().enumerate() {
            let all = v.warm + v.cold;
            let _ = write!(
                h,
                "{} <span class=\"image\">{}</span> {} warm / {} cold ({}% warm)",
                if i == 0 { "" } else { " ·" },
                esc(&v.image),
                v.warm,
                v.cold,
                (v.warm * 100).checked_div(all).unwrap_or(0),
            );
        }
        h.push_str("</p>");
    }
    for s in &r.shapes {
        shape(h, s);
    }
    h.push_str("<h3>Pending jobs</h3>");
    if r.pending.is_empty() {
        h.push_str("<p class=\"empty\">None waiting.</p>");
    } else {
        waiting_table(h, "pending", &r.pending, true);
    }
    h.push_str("<h3>Recent jobs</h3>");
    if r.recent.is_empty() {
        h.push_str("<p class=\"empty\">None yet.</p>");
    } else {
        h.push_str(
            "<table class=\"recent\"><thead><tr><th>job</th><th>name</th><th>stage</th>\
             <th>outcome</th><th>reason</th><th>where</th><th>waited</th><th>ran</th>",
        );
        if r.costs.is_some() {
            h.push_str("<th>cost</th>");
        }
        h.push_str("</tr></thead><tbody>");
        for j in &r.recent {
            let reason = match (&j.failure_reason, &j.message) {
                (Some(r), Some(m)) if !m.is_empty() => format!("{r}: {m}"),
                (Some(r), _) => r.clone(),
                (None, Some(m)) => m.clone(),
                (None, None) => String::new(),
            };
            let place = match (&j.instance, j.slot) {
                (Some(i), Some(s)) => format!("{i} slot {s}"),
                _ => "never ran".into(),
            };
            let _ = write!(
                h,
                "<tr data-job=\"{}\" data-outcome=\"{o}\"><td>#{}</td><td>{}</td><td>{}</td>\
                 <td class=\"outcome {o}\">{o}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                j.id,
                j.id,
                esc(&j.name),
                esc(&j.stage),
                esc(&reason),
                esc(&place),
                duration(j.wait_s),
                duration(j.duration_s),
                o = esc(&j.outcome),
            );
            if r.costs.is_some() {
                let cost = match (j.cost, &j.currency) {
                    (Some(c), Some(cur)) => money(c, cur),
                    _ => "unknown".into(),
                };
                let _ = write!(h, "<td class=\"cost\">{}</td>", esc(&cost));
            }
            h.push_str("</tr>");
        }
        h.push_str("</tbody></table>");
    }
    h.push_str("</section>");
}

/// A table of waiting jobs: a runner's (`pending`, with their level) or the queue's (`queued`,
/// no level yet).
fn waiting_table(h: &mut String, class: &str, jobs: &[PendingJob], with_level: bool) {
    let (level, waited) = if with_level {
        ("<th>level</th>", "waiting")
    } else {
        ("", "queued for")
    };
    let _ = write!(
        h,
        "<table class=\"{class}\"><thead><tr><th>job</th><th>name</th><th>stage</th>{level}\
         <th>{waited}</th></tr></thead><tbody>"
    );
    for p in jobs {
        let _ = write!(
            h,
            "<tr data-job=\"{}\"><td>#{}</td><td>{}</td><td>{}</td>",
            p.id,
            p.id,
            esc(&p.name),
            esc(&p.stage)
        );
        if with_level {
            let _ = write!(h, "<td>{}</td>", esc(&p.level));
        }
        let _ = write!(h, "<td>{}</td></tr>", duration(p.wait_s));
    }
    h.push_str("</tbody></table>");
}

fn shape(h: &mut String, s: &ShapeStatus) {
    let _ = write!(
        h,
        "<div class=\"shape\" data-shape=\"{n}\"><h3>Shape {n} <small>{r}group {g} · {c} slots \
         per instance · max {m} instances</small></h3>",
        n = esc(&s.name),
        r = if s.role.is_empty() {
            String::new()
        } else {
            format!("<b class=\"role\">{}</b> · ", esc(&s.role))
        },
        g = esc(&s.group),
        c = s.capacity_per_instance,
        m = if s.max_instances == 0 {
            "∞".to_string()
        } else {
            s.max_instances.to_string()
        },
    );
    if let Some(n) = &s.no_capacity {
        let _ = write!(
            h,
            "<p class=\"no-capacity\">No capacity for new instances for {} ({} refusals){}.</p>",
            duration(n.since_s),
            n.refusals,
            match &n.diverted_to {
                Some(to) => format!(": new capacity goes to {}", esc(to)),
                None => String::new(),
            }
        );
    }
    if s.instances.is_empty() {
        h.push_str("<p class=\"empty\">No instances.</p></div>");
        return;
    }
    h.push_str(
        "<table class=\"instances\"><thead><tr><th>instance</th><th>state</th><th>age</th>\
         <th>uses</th><th>slots</th><th>snapshots</th></tr></thead><tbody>",
    );
    for i in &s.instances {
        instance(h, i, s.max_use_count);
    }
    h.push_str("</tbody></table></div>");
}

fn instance(h: &mut String, i: &InstanceStatus, max_use: u32) {
    let uses = if max_use == 0 {
        i.uses.to_string()
    } else {
        format!("{}/{max_use}", i.uses)
    };
    let _ = write!(
        h,
        "<tr class=\"instance\" data-instance=\"{id}\" data-state=\"{st}\"><td class=\"id\">{id}</td>\
         <td class=\"state {st}\">{st}</td><td>{}</td><td>{uses}</td><td><div class=\"slots\">",
        duration(i.age_s),
        id = esc(&i.id),
        st = esc(&i.state),
    );
    for s in &i.slots {
        match &s.job {
            Some(j) => {
                let _ = write!(
                    h,
                    "<span class=\"slot busy\" data-slot=\"{}\" data-job=\"{}\" title=\"slot {} · {} · {}\">\
                     <b>#{} {}</b><i>{} · {}</i></span>",
                    s.slot,
                    j.id,
                    s.slot,
                    esc(&j.stage),
                    esc(&j.level),
                    j.id,
                    esc(&j.name),
                    esc(&j.level),
                    duration(j.elapsed_s),
                );
            }
            None => {
                let _ = write!(
                    h,
                    "<span class=\"slot free\" data-slot=\"{}\" title=\"slot {}\"><i>free</i></span>",
                    s.slot, s.slot
                );
            }
        }
    }
    h.push_str("</div></td><td>");
    for sn in &i.snapshots {
        let _ = write!(
            h,
            "<span class=\"snapshot\" data-snapshot=\"{n}\">{n} <i>{} · {}</i></span>",
            bytes(sn.bytes),
            duration(sn.age_s),
            n = esc(&sn.name),
        );
    }
    h.push_str("</td></tr>");
}

/// The four charts of the last hours, as inline SVG.
pub fn charts(h: &mut String, hist: &HistorySeries) {
    let to_f = |v: &[u32]| v.iter().map(|x| f64::from(*x)).collect::<Vec<f64>>();
    let span = duration(hist.t_ms.len() as f64 * hist.interval_s);
    let span = span.as_str();
    chart(
        h,
        "instances",
        "Instances",
        &to_f(&hist.instances),
        "",
        span,
    );
    chart(
        h,
        "busy_slots",
        "Busy slots",
        &to_f(&hist.busy_slots),
        "",
        span,
    );
    let depth = to_f(&hist.queue_depth);
    chart(h, "queue_depth", "Queue depth", &depth, "", span);
    chart(h, "p95_wait_s", "p95 wait", &hist.p95_wait_s, "s", span);
}

fn chart(h: &mut String, key: &str, title: &str, values: &[f64], unit: &str, span: &str) {
    const W: f64 = 300.0;
    const H: f64 = 60.0;
    let max = values.iter().copied().fold(0.0_f64, f64::max).max(1.0);
    let last = values.last().copied().unwrap_or(0.0);
    let step = if values.len() > 1 {
        W / (values.len() - 1) as f64
    } else {
        0.0
    };
    let mut points = String::new();
    for (i, v) in values.iter().enumerate() {
        let _ = write!(
            points,
            "{:.1},{:.1} ",
            i as f64 * step,
            H - (v / max) * (H - 4.0) - 2.0
        );
    }
    let _ = write!(
        h,
        "<figure class=\"chart\" data-series=\"{key}\"><figcaption>{title} <b>{}{unit}</b> \
         <small>max {}{unit} · last {span}</small></figcaption><svg viewBox=\"0 0 {W} {H}\" \
         preserveAspectRatio=\"none\"><polyline points=\"{}\"/></svg></figure>",
        trim_num(last),
        trim_num(max),
        points.trim_end()
    );
}

/// `3`, `2.5`: no trailing zeros.
fn trim_num(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

/// HTML-escape text for element content and quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::shape_with_one_job;

    fn fleet_of_one() -> FleetStatus {
        FleetStatus {
            version: "0.1.0".into(),
            runners: vec![RunnerStatus {
                name: "r<1>".into(),
                executor: "instance".into(),
                shapes: vec![shape_with_one_job("build \"x\"", 61.0)],
                pending: vec![crate::model::PendingJob {
                    id: 8,
                    name: "<test>".into(),
                    stage: "test".into(),
                    level: "vm".into(),
                    wait_s: 75.0,
                }],
                vm_starts: vec![crate::model::VmStarts {
                    image: "ci-<vm>".into(),
                    warm: 3,
                    cold: 1,
                }],
                ..RunnerStatus::default()
            }],
            ..FleetStatus::default()
        }
    }

    #[test]
    fn the_page_shows_costs_and_says_when_they_are_unknown() {
        let mut s = fleet_of_one();
        let r = &mut s.runners[0];
        r.costs = Some(crate::model::RunnerCosts {
            currency: "EUR".into(),
            per_hour: 0.34,
            billed: 4.0,
            jobs: 3.0,
            overhead: 1.0,
            unpriced: vec!["gpu".into()],
        });
        r.recent = vec![
            crate::model::RecentJob {
                id: 1,
                cost: Some(0.0042),
                currency: Some("EUR".into()),
                ..crate::model::RecentJob::default()
            },
            crate::model::RecentJob {
                id: 2,
                ..crate::model::RecentJob::default()
            },
        ];
        let page = render(&s, 2000);
        assert!(
            page.contains(
                "Cost: <b>0.3400 EUR</b> per hour now · 4.00 EUR billed · 3.00 EUR to jobs · \
                 1.00 EUR overhead (25%)"
            ),
            "{page}"
        );
        assert!(
            page.contains("Cost unknown for shapes without a price: gpu."),
            "{page}"
        );
        assert!(
            page.contains("<td class=\"cost\">0.0042 EUR</td>"),
            "{page}"
        );
        assert!(page.contains("<td class=\"cost\">unknown</td>"), "{page}");
        // A runner without costs (local jobs) has no cost column.
        let mut s = fleet_of_one();
        s.runners[0].recent = vec![crate::model::RecentJob::default()];
        let page = render(&s, 2000);
        assert!(page.contains("<th>ran</th></tr></thead>"), "{page}");
    }

    #[test]
    fn the_page_shows_slots_with_their_jobs_escaped() {
        let page = render(&fleet_of_one(), 2000);
        assert!(page.contains("data-runner=\"r&lt;1&gt;\""), "{page}");
        assert!(page.contains("data-instance=\"i-1\""));
        assert!(page.contains("data-slot=\"0\" data-job=\"7\""));
        assert!(page.contains("#7 build &quot;x&quot;"));
        assert!(page.contains("cgroup · 1m01s"));
        assert!(page.contains("class=\"slot free\" data-slot=\"1\""));
        assert!(
            page.contains(
                "<tr data-job=\"8\"><td>#8</td><td>&lt;test&gt;</td><td>test</td><td>vm</td><td>1m15s</td></tr>"
            ),
            "{page}"
        );
        assert!(
            page.contains(
                "VM starts: <span class=\"image\">ci-&lt;vm&gt;</span> 3 warm / 1 cold (75% warm)"
            ),
            "{page}"
        );
        assert!(!page.contains("build \"x\""), "unescaped text");
        assert!(page.contains("<script>"));
    }

    #[test]
    fn a_spot_shape_without_capacity_says_where_new_capacity_goes() {
        let mut spot = shape_with_one_job("build", 1.0);
        spot.name = "spot".into();
        spot.role = "spot".into();
        spot.no_capacity = Some(crate::model::NoCapacity {
            since_s: 95.0,
            refusals: 12,
            diverted_to: Some("on-<demand>".into()),
        });
        let mut h = String::new();
        shape(&mut h, &spot);
        assert!(
            h.contains("<small><b class=\"role\">spot</b> · group g"),
            "{h}"
        );
        assert!(
            h.contains(
                "No capacity for new instances for 1m35s (12 refusals): new capacity goes to \
                 on-&lt;demand&gt;."
            ),
            "{h}"
        );
        let mut plain = String::new();
        shape(&mut plain, &shape_with_one_job("build", 1.0));
        assert!(
            !plain.contains("role") && !plain.contains("No capacity"),
            "{plain}"
        );
    }

    #[test]
    fn charts_scale_to_their_maximum() {
        let mut h = String::new();
        chart(&mut h, "k", "K", &[0.0, 5.0, 10.0], "", "30s");
        assert!(h.contains("max 10 · last 30s"), "{h}");
        assert!(h.contains("<b>10</b>"), "{h}");
        assert!(
            h.contains("points=\"0.0,58.0 150.0,30.0 300.0,2.0\""),
            "{h}"
        );
    }
}
