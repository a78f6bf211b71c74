//! The report as an aligned table, JSON, YAML, CSV or a self-contained HTML page.

use std::fmt::Write as _;
use std::io::Write;

use comfy_table::{Cell, CellAlignment, Table, presets};

use super::{DaemonSetReport, Delta, HistorySpan, Report, Resources, Row, SortBy, Source, Totals};

/// How the report is shown, besides its format.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The order of the rows across DaemonSets (CSV, table without headers, HTML).
    pub sort: SortBy,
    /// Whether header lines are printed (`--no-headers` turns them off).
    pub headers: bool,
    /// The namespace read; `None` for every namespace.
    pub namespace: Option<String>,
}

const KI: i64 = 1 << 10;
const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

/// CPU as Kubernetes writes it: `250m`, `2`.
pub fn cpu(millis: i64) -> String {
    if millis % 1000 == 0 {
        format!("{}", millis / 1000)
    } else {
        format!("{millis}m")
    }
}

/// Memory in binary units: `64Mi`, `1Gi`, `1.5Gi`, `300Ki`, `12` (bytes).
pub fn memory(bytes: i64) -> String {
    let abs = bytes.unsigned_abs();
    let (unit, name) = match abs {
        a if a >= GI as u64 => (GI, "Gi"),
        a if a >= MI as u64 => (MI, "Mi"),
        a if a >= KI as u64 => (KI, "Ki"),
        _ => return bytes.to_string(),
    };
    if bytes % unit == 0 {
        format!("{}{name}", bytes / unit)
    } else {
        let v = bytes as f64 / unit as f64;
        let text = format!("{v:.1}");
        format!("{}{name}", text.trim_end_matches(".0"))
    }
}

fn signed(v: i64, f: fn(i64) -> String) -> String {
    match v {
        0 => "0".to_string(),
        v if v > 0 => format!("+{}", f(v)),
        v => format!("-{}", f(-v)),
    }
}

fn pair(r: Resources) -> String {
    if r.cpu_millis.is_none() && r.memory_bytes.is_none() {
        return "-".to_string();
    }
    format!(
        "{} / {}",
        r.cpu_millis.map(cpu).unwrap_or_else(|| "-".to_string()),
        r.memory_bytes.map(memory).unwrap_or_else(|| "-".to_string())
    )
}

fn totals_line(t: &Totals) -> String {
    let net = t.net();
    format!(
        "frees {} CPU and {} memory, needs {} CPU and {} memory on top (net {} CPU, {} memory); {} OOM kills",
        cpu(t.cpu_free_millis),
        memory(t.memory_free_bytes),
        cpu(t.cpu_needed_millis),
        memory(t.memory_needed_bytes),
        signed(net.cpu_millis, cpu),
        signed(net.memory_bytes, memory),
        t.oom_kills
    )
}

fn plain_table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(header.iter().map(Cell::new));
    table
}

fn right(text: String) -> Cell {
    Cell::new(text).set_alignment(CellAlignment::Right)
}

/// The columns of a row in the table; `wide` adds the source in the words of the pod's
/// annotation.
fn row_cells(r: &Row, wide: bool) -> Vec<Cell> {
    let mut cells = vec![
        Cell::new(&r.node),
        Cell::new(r.label()),
        right(pair(r.template)),
        right(if r.has_pod {
            pair(r.current)
        } else {
            "no pod".to_string()
        }),
        right(pair(r.target)),
        right(pair(r.lower_bound)),
        right(pair(r.upper_bound)),
        right(history(&r.history)),
        Cell::new(r.source.as_str()),
    ];
    if wide {
        cells.push(Cell::new(&r.source_detail));
    }
    cells.extend([
        right(r.oom_kills.to_string()),
        right(signed(r.delta.cpu_millis, cpu)),
        right(signed(r.delta.memory_bytes, memory)),
    ]);
    cells
}

/// How long the history behind a row's figures is, in its two largest units (`8d`, `2d3h`,
/// `5h12m`, `2m`, `0m` for one sample; `n=N`, N samples, where the times are not known); `-` without
/// figures of the node. A figure from two minutes is not one from eight days: VPA's confidence
/// is the days of history.
pub fn history(h: &HistorySpan) -> String {
    if h.sample_count == 0 {
        return "-".to_string();
    }
    if h.first_sample_time.is_none() || h.last_sample_time.is_none() {
        // an agent that published no sample times: how many, at least (one word, as every
        // cell of the table, for whoever splits its lines)
        return format!("n={}", h.sample_count);
    }
    let (days, hours, minutes) = (
        h.seconds / 86_400,
        h.seconds % 86_400 / 3600,
        h.seconds % 3600 / 60,
    );
    match (days, hours, minutes) {
        // one sample, or samples less than a minute apart
        (0, 0, 0) => "<1m".to_string(),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

/// The column names of a DaemonSet's table.
pub fn row_header(wide: bool) -> Vec<&'static str> {
    let mut header = vec![
        "NODE",
        "CONTAINER",
        "TEMPLATE",
        "CURRENT",
        "TARGET",
        "LOWER",
        "UPPER",
        "HISTORY",
        "SOURCE",
    ];
    if wide {
        header.push("DETAIL");
    }
    header.extend(["OOM", "CPU Δ", "MEMORY Δ"]);
    header
}

/// Where `--prometheus` figures come from, in one sentence.
pub fn history_line(h: &super::history::Source) -> String {
    let time = |ms: i64| {
        k8s_openapi::jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_else(|_| ms.to_string())
    };
    let mut line = format!(
        "Figures computed from Prometheus history ({}, {} to {}, one sample per {}s, CPU rate over {}s), \
         not read from the cluster.",
        h.prometheus,
        time(h.start_ms),
        time(h.end_ms),
        h.resolution_seconds,
        h.rate_window_seconds
    );
    if !h.without_autoscaler.is_empty() {
        line.push_str(" Without a DaemonSetAutoscaler (defaults used, mode none): ");
        line.push_str(&h.without_autoscaler.join(", "));
        line.push('.');
    }
    if h.unplaced_containers > 0 {
        line.push_str(&format!(
            " Left out: {} containers whose series have no node label and whose pod is gone.",
            h.unplaced_containers
        ));
    }
    line
}

fn no_autoscalers(view: &View, history: bool) -> String {
    if history {
        return match &view.namespace {
            Some(ns) => format!("No DaemonSets found in namespace {ns} (-A for every namespace)."),
            None => "No DaemonSets found.".to_string(),
        };
    }
    match &view.namespace {
        Some(ns) => format!("No DaemonSetAutoscalers found in namespace {ns} (-A for every namespace)."),
        None => "No DaemonSetAutoscalers found.".to_string(),
    }
}

/// The default output: one table per DaemonSet, then the nodes, then the overall totals; `wide`
/// adds columns. Without headers: only the rows, one line each, across DaemonSets in the view's
/// order, the first field namespace/DaemonSet.
pub fn table(report: &Report, view: &View, wide: bool, out: &mut dyn Write) -> std::io::Result<()> {
    if !view.headers {
        let mut t = Table::new();
        t.load_preset(presets::NOTHING);
        for (ds, r) in report.rows_sorted(view.sort) {
            let mut cells = vec![Cell::new(format!("{}/{}", ds.namespace, ds.daemonset))];
            cells.extend(row_cells(r, wide));
            t.add_row(cells);
        }
        if t.row_count() == 0 {
            return Ok(());
        }
        // lines start at the first column, as kubectl's
        for line in t.lines() {
            writeln!(out, "{}", line.strip_prefix(' ').unwrap_or(&line).trim_end())?;
        }
        return Ok(());
    }
    if let Some(h) = &report.history {
        writeln!(out, "{}\n", history_line(h))?;
    }
    if report.daemonsets.is_empty() {
        return writeln!(out, "{}", no_autoscalers(view, report.history.is_some()));
    }
    for ds in &report.daemonsets {
        writeln!(
            out,
            "DaemonSet {}/{} (autoscaler {}, mode {})",
            ds.namespace, ds.daemonset, ds.autoscaler, ds.mode
        )?;
        if let Some(problem) = &ds.problem {
            writeln!(out, "  {problem}\n")?;
            continue;
        }
        if ds.rows.is_empty() {
            writeln!(out, "  no pods and no recommendations yet\n")?;
            continue;
        }
        let mut t = plain_table(&row_header(wide));
        for r in &ds.rows {
            t.add_row(row_cells(r, wide));
        }
        writeln!(out, "{t}")?;
        // figures held at the node's allocatable or maxAllowed, rather than VPA's
        for r in &ds.rows {
            if let Some(capped) = &r.capped {
                writeln!(out, "  {} {}: capped {capped}", r.node, r.container)?;
            }
        }
        writeln!(out, "  {}\n", totals_line(&ds.totals))?;
    }
    if !report.nodes.is_empty() {
        writeln!(out, "By node (every autoscaled DaemonSet)")?;
        let mut t = plain_table(&["NODE", "CURRENT", "TARGET", "FREES", "NEEDS", "OOM"]);
        for n in &report.nodes {
            t.add_row(vec![
                Cell::new(&n.node),
                right(format!(
                    "{} / {}",
                    cpu(n.current.cpu_millis),
                    memory(n.current.memory_bytes)
                )),
                right(format!(
                    "{} / {}",
                    cpu(n.target.cpu_millis),
                    memory(n.target.memory_bytes)
                )),
                right(format!(
                    "{} / {}",
                    cpu(n.totals.cpu_free_millis),
                    memory(n.totals.memory_free_bytes)
                )),
                right(format!(
                    "{} / {}",
                    cpu(n.totals.cpu_needed_millis),
                    memory(n.totals.memory_needed_bytes)
                )),
                right(n.totals.oom_kills.to_string()),
            ]);
        }
        writeln!(out, "{t}\n")?;
    }
    writeln!(out, "Total: {}", totals_line(&report.totals))
}

/// The report as JSON (quantities as millicores and bytes).
pub fn json(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    writeln!(out)
}

/// The report as YAML: the JSON document, key for key.
pub fn yaml(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    serde_yaml_ng::to_writer(&mut *out, report).map_err(std::io::Error::other)
}

/// The CSV columns.
/// `sidecar` comes last, after the columns of earlier versions, so that their positions hold.
pub const CSV_HEADER: [&str; 25] = [
    "namespace",
    "autoscaler",
    "daemonset",
    "mode",
    "node",
    "container",
    "source",
    "has_pod",
    "template_cpu_millis",
    "template_memory_bytes",
    "current_cpu_millis",
    "current_memory_bytes",
    "target_cpu_millis",
    "target_memory_bytes",
    "lower_cpu_millis",
    "lower_memory_bytes",
    "upper_cpu_millis",
    "upper_memory_bytes",
    "oom_kills",
    "delta_cpu_millis",
    "delta_memory_bytes",
    "sample_count",
    "first_sample_time",
    "last_sample_time",
    "sidecar",
];

/// One line per DaemonSet, node and container, in the view's order; quantities as millicores
/// and bytes.
pub fn csv(report: &Report, view: &View, out: &mut dyn Write) -> std::io::Result<()> {
    let mut w = csv::Writer::from_writer(out);
    if view.headers {
        w.write_record(CSV_HEADER)?;
    }
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    for (ds, r) in report.rows_sorted(view.sort) {
        w.write_record([
            ds.namespace.clone(),
            ds.autoscaler.clone(),
            ds.daemonset.clone(),
            ds.mode.clone(),
            r.node.clone(),
            r.container.clone(),
            r.source.as_str().to_string(),
            r.has_pod.to_string(),
            opt(r.template.cpu_millis),
            opt(r.template.memory_bytes),
            opt(r.current.cpu_millis),
            opt(r.current.memory_bytes),
            opt(r.target.cpu_millis),
            opt(r.target.memory_bytes),
            opt(r.lower_bound.cpu_millis),
            opt(r.lower_bound.memory_bytes),
            opt(r.upper_bound.cpu_millis),
            opt(r.upper_bound.memory_bytes),
            r.oom_kills.to_string(),
            r.delta.cpu_millis.to_string(),
            r.delta.memory_bytes.to_string(),
            r.history.sample_count.to_string(),
            r.history.first_sample_time.clone().unwrap_or_default(),
            r.history.last_sample_time.clone().unwrap_or_default(),
            r.sidecar.to_string(),
        ])?;
    }
    w.flush()
}

fn escape(s: &str) -> String {
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

/// Which figure of a row a chart shows.
#[derive(Clone, Copy)]
enum Axis {
    Cpu,
    Memory,
}

impl Axis {
    fn get(self, r: Resources) -> Option<i64> {
        match self {
            Axis::Cpu => r.cpu_millis,
            Axis::Memory => r.memory_bytes,
        }
    }

    fn label(self, v: i64) -> String {
        match self {
            Axis::Cpu => cpu(v),
            Axis::Memory => memory(v),
        }
    }

    fn title(self) -> &'static str {
        match self {
            Axis::Cpu => "CPU requests",
            Axis::Memory => "memory requests",
        }
    }
}

/// Per node (summed over the DaemonSet's containers): the template (dashed line), the current
/// request (grey bar), the target (blue bar) and the lower–upper bounds (whisker).
fn chart(ds: &DaemonSetReport, axis: Axis) -> String {
    struct Bar {
        node: String,
        template: i64,
        current: i64,
        target: i64,
        bounds: Option<(i64, i64)>,
    }
    let mut bars: Vec<Bar> = Vec::new();
    for r in &ds.rows {
        let sum = |v: Option<i64>| v.unwrap_or(0);
        let bounds = match (axis.get(r.lower_bound), axis.get(r.upper_bound)) {
            (Some(l), Some(u)) => Some((l, u)),
            _ => None,
        };
        match bars.last_mut().filter(|b| b.node == r.node) {
            Some(b) => {
                b.template += sum(axis.get(r.template));
                b.current += sum(axis.get(r.current));
                b.target += sum(axis.get(r.target));
                b.bounds = match (b.bounds, bounds) {
                    (Some((l1, u1)), Some((l2, u2))) => Some((l1 + l2, u1 + u2)),
                    _ => None,
                };
            }
            None => bars.push(Bar {
                node: r.node.clone(),
                template: sum(axis.get(r.template)),
                current: sum(axis.get(r.current)),
                target: sum(axis.get(r.target)),
                bounds,
            }),
        }
    }
    let max = bars
        .iter()
        .map(|b| {
            b.template
                .max(b.current)
                .max(b.target)
                .max(b.bounds.map_or(0, |(_, u)| u))
        })
        .max()
        .unwrap_or(0)
        .max(1);
    let (label_w, plot_w, row_h) = (220.0, 460.0, 34.0);
    let height = 40.0 + row_h * bars.len() as f64;
    let x = |v: i64| label_w + plot_w * (v as f64 / max as f64);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg width="{w}" height="{height}" role="img" aria-label="{title} per node">"#,
        w = label_w + plot_w + 90.0,
        title = axis.title()
    );
    let _ = write!(
        svg,
        r#"<text x="0" y="14" class="t">{} per node</text>"#,
        axis.title()
    );
    for (i, b) in bars.iter().enumerate() {
        let y = 28.0 + row_h * i as f64;
        let _ = write!(
            svg,
            r#"<text x="{lx}" y="{ty}" text-anchor="end">{node}</text>"#,
            lx = label_w - 8.0,
            ty = y + 17.0,
            node = escape(&b.node)
        );
        let _ = write!(
            svg,
            r##"<rect x="{label_w}" y="{y}" width="{w:.1}" height="11" fill="#9e9e9e"><title>current {v}</title></rect>"##,
            w = x(b.current) - label_w,
            v = axis.label(b.current)
        );
        let _ = write!(
            svg,
            r##"<rect x="{label_w}" y="{y2}" width="{w:.1}" height="11" fill="#1f77b4"><title>target {v}</title></rect>"##,
            y2 = y + 13.0,
            w = x(b.target) - label_w,
            v = axis.label(b.target)
        );
        if let Some((l, u)) = b.bounds {
            let yy = y + 18.5;
            let _ = write!(
                svg,
                r##"<line x1="{x1:.1}" x2="{x2:.1}" y1="{yy}" y2="{yy}" stroke="#111" stroke-width="1.5"><title>bounds {lt} – {ut}</title></line>"##,
                x1 = x(l),
                x2 = x(u),
                lt = axis.label(l),
                ut = axis.label(u)
            );
        }
        let _ = write!(
            svg,
            r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{y0}" y2="{y1}" stroke="#d62728" stroke-dasharray="3,2"><title>template {v}</title></line>"##,
            tx = x(b.template),
            y0 = y - 2.0,
            y1 = y + 26.0,
            v = axis.label(b.template)
        );
        let _ = write!(
            svg,
            r#"<text x="{vx:.1}" y="{ty}">{v}</text>"#,
            vx = x(b.current.max(b.target).max(b.template)) + 6.0,
            ty = y + 17.0,
            v = axis.label(b.target)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A `<td>` whose text is `text` and whose sort key is `(v, w)` (the script compares `v`, then `w`).
fn td_num(text: &str, v: i64, w: i64) -> String {
    format!("<td data-v=\"{v}\" data-w=\"{w}\">{}</td>", escape(text))
}

fn td_pair(r: Resources) -> String {
    td_num(&pair(r), r.cpu_millis.unwrap_or(-1), r.memory_bytes.unwrap_or(-1))
}

fn html_row(ds: &DaemonSetReport, r: &Row) -> String {
    let mut tr = String::from("<tr>");
    for text in [&ds.namespace, &ds.daemonset, &r.node, &r.label()] {
        let _ = write!(tr, "<td>{}</td>", escape(text));
    }
    tr.push_str(&td_pair(r.template));
    tr.push_str(&if r.has_pod {
        td_pair(r.current)
    } else {
        td_num("no pod", -1, -1)
    });
    for b in [r.target, r.lower_bound, r.upper_bound] {
        tr.push_str(&td_pair(b));
    }
    tr.push_str(&td_num(
        &history(&r.history),
        r.history.seconds,
        r.history.sample_count,
    ));
    let _ = write!(
        tr,
        "<td title=\"{}\">{}</td>",
        escape(&r.source_detail),
        r.source.as_str()
    );
    tr.push_str(&td_num(&r.oom_kills.to_string(), r.oom_kills, 0));
    tr.push_str(&td_num(
        &signed(r.delta.cpu_millis, cpu),
        r.delta.cpu_millis,
        r.delta.memory_bytes,
    ));
    tr.push_str(&td_num(
        &signed(r.delta.memory_bytes, memory),
        r.delta.memory_bytes,
        r.delta.cpu_millis,
    ));
    tr.push_str("</tr>");
    tr
}

fn delta_pair(d: Delta) -> String {
    format!("{} / {}", cpu(d.cpu_millis), memory(d.memory_bytes))
}

const STYLE: &str = concat!(
    "body{font:14px system-ui,sans-serif;margin:2em;color:#111}",
    "table{border-collapse:collapse;margin:.5em 0 1em}",
    "td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}",
    "#rows td:nth-child(-n+4),#rows th:nth-child(-n+4),#nodes td:first-child,#nodes th:first-child,",
    ".summary th{text-align:left}",
    "thead th{position:sticky;top:0;background:#f4f4f4;cursor:pointer;user-select:none}",
    "thead th[aria-sort=ascending]::after{content:\" \\25B2\"}",
    "thead th[aria-sort=descending]::after{content:\" \\25BC\"}",
    "tbody tr:hover{background:#eef4fb}",
    ".free{color:#1a7f37}.need{color:#b35900}",
    "#filter{font:inherit;padding:4px 8px;width:28em}#shown{margin-left:1em;color:#555}",
    "svg{display:block;margin:.5em 0;font:12px system-ui,sans-serif}.t{font-weight:600}",
    ".legend span{display:inline-block;margin-right:1.5em}details{margin:.3em 0}",
);

/// Sorts a `table.sortable` by a click on (or Enter in) a column header, filters `#rows` by the
/// words of `#filter` (every word must appear in the row), and reads `#sort=<column>` and
/// `q=<words>` from the address's fragment (e.g. `#sort=-cpu-delta&q=web`).
const SCRIPT: &str = r#"(function(){
'use strict';
function key(td){var v=td.getAttribute('data-v');return v===null?null:[Number(v),Number(td.getAttribute('data-w'))];}
function sortBy(t,i,dir){
  var head=t.tHead.rows[0].cells,th=head[i];
  var asc=dir?dir==='ascending':th.getAttribute('aria-sort')!=='ascending';
  for(var j=0;j<head.length;j++){head[j].removeAttribute('aria-sort');}
  th.setAttribute('aria-sort',asc?'ascending':'descending');
  var body=t.tBodies[0],rows=Array.prototype.slice.call(body.rows);
  rows.sort(function(a,b){
    var x=a.cells[i],y=b.cells[i],kx=key(x),ky=key(y),c;
    if(kx&&ky){c=(kx[0]-ky[0])||(kx[1]-ky[1]);}
    else{c=x.textContent.localeCompare(y.textContent,undefined,{numeric:true});}
    return asc?c:-c;
  });
  var f=document.createDocumentFragment();
  rows.forEach(function(r){f.appendChild(r);});
  body.appendChild(f);
}
var tables=document.querySelectorAll('table.sortable');
Array.prototype.forEach.call(tables,function(t){
  Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){
    th.tabIndex=0;
    th.addEventListener('click',function(){sortBy(t,i);});
    th.addEventListener('keydown',function(e){if(e.key==='Enter'){sortBy(t,i);}});
  });
});
var input=document.getElementById('filter'),table=document.getElementById('rows'),shown=document.getElementById('shown');
function filter(){
  if(!table){return;}
  var words=input.value.toLowerCase().split(/\s+/).filter(Boolean),rows=table.tBodies[0].rows,n=0;
  for(var i=0;i<rows.length;i++){
    var text=rows[i].textContent.toLowerCase();
    var show=words.every(function(w){return text.indexOf(w)>=0;});
    rows[i].hidden=!show;if(show){n++;}
  }
  shown.textContent=n+' of '+rows.length+' rows';
}
input.addEventListener('input',filter);
var hash=new URLSearchParams(location.hash.slice(1));
var sort=hash.get('sort');
if(sort&&table){
  var desc=sort.charAt(0)==='-',name=desc?sort.slice(1):sort;
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
    if(th.getAttribute('data-key')===name){sortBy(table,i,desc?'descending':'ascending');}
  });
}
if(hash.get('q')){input.value=hash.get('q');}
filter();
document.body.setAttribute('data-ready','true');
})();"#;

/// The columns of the page's table of rows: key (for `#sort=`) and title.
pub const HTML_COLUMNS: [(&str, &str); 14] = [
    ("namespace", "namespace"),
    ("daemonset", "DaemonSet"),
    ("node", "node"),
    ("container", "container"),
    ("template", "template"),
    ("current", "current"),
    ("target", "target"),
    ("lower", "lower"),
    ("upper", "upper"),
    ("history", "history"),
    ("source", "source"),
    ("oom", "OOM"),
    ("cpu-delta", "CPU Δ"),
    ("memory-delta", "memory Δ"),
];

fn summary(report: &Report) -> String {
    let t = &report.totals;
    let net = t.net();
    let mut html = String::from("<section id=\"summary\"><h2>Summary</h2>\n");
    html.push_str(
        "<table class=\"summary\"><thead><tr><th></th><th>frees</th><th>needs on top</th><th>net</th></tr></thead><tbody>\n",
    );
    let _ = writeln!(
        html,
        "<tr><th>CPU</th><td id=\"cpu-free\" class=\"free\">{}</td><td id=\"cpu-needed\" class=\"need\">{}</td><td id=\"cpu-net\">{}</td></tr>",
        cpu(t.cpu_free_millis),
        cpu(t.cpu_needed_millis),
        signed(net.cpu_millis, cpu)
    );
    let _ = writeln!(
        html,
        "<tr><th>memory</th><td id=\"memory-free\" class=\"free\">{}</td><td id=\"memory-needed\" class=\"need\">{}</td><td id=\"memory-net\">{}</td></tr>",
        memory(t.memory_free_bytes),
        memory(t.memory_needed_bytes),
        signed(net.memory_bytes, memory)
    );
    html.push_str("</tbody></table>\n");
    let rows = report.daemonsets.iter().map(|d| d.rows.len()).sum::<usize>();
    let (mut freeing, mut needing) = (0, 0);
    for n in &report.nodes {
        let t = n.totals;
        if t.cpu_free_millis + t.memory_free_bytes > 0 {
            freeing += 1;
        }
        if t.cpu_needed_millis + t.memory_needed_bytes > 0 {
            needing += 1;
        }
    }
    let _ = writeln!(
        html,
        "<p id=\"counts\">{} DaemonSets, {} nodes ({freeing} would free, {needing} would need more), {rows} rows, {} OOM kills</p>",
        report.daemonsets.len(),
        report.nodes.len(),
        t.oom_kills
    );
    let mut by_source = Vec::new();
    for source in [
        Source::Node,
        Source::Group,
        Source::Fleet,
        Source::None,
        Source::Off,
    ] {
        let n = report
            .daemonsets
            .iter()
            .flat_map(|d| &d.rows)
            .filter(|r| r.source == source)
            .count();
        let name = source.as_str();
        by_source.push(format!("<span id=\"source-{name}\">{name} {n}</span>"));
    }
    let by_source = by_source.join(", ");
    let _ = writeln!(html, "<p id=\"sources\">Rows by source: {by_source}</p>");
    let problems: Vec<&DaemonSetReport> = report.daemonsets.iter().filter(|d| d.problem.is_some()).collect();
    if !problems.is_empty() {
        html.push_str("<ul id=\"problems\">");
        for d in problems {
            let _ = write!(
                html,
                "<li>{}</li>",
                escape(d.problem.as_deref().unwrap_or_default())
            );
        }
        html.push_str("</ul>\n");
    }
    html.push_str("</section>\n");
    html
}

/// A single page with no external assets: a summary (what the fleet frees and needs, counts by
/// source), every row in one table, sorted as the view says, to sort by a click on a column and
/// to filter; the nodes' totals; per DaemonSet, its totals and a chart per resource (folded).
pub fn html(report: &Report, view: &View, out: &mut dyn Write) -> std::io::Result<()> {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>nodewarden report</title>\n<style>{STYLE}</style></head><body>\n<h1>nodewarden report</h1>\n"
    );
    let _ = writeln!(
        page,
        "<p>{}</p>",
        escape(&match &view.namespace {
            Some(ns) => format!("Namespace {ns}."),
            None => "Every namespace.".to_string(),
        })
    );
    if let Some(h) = &report.history {
        let _ = writeln!(page, "<p id=\"history\">{}</p>", escape(&history_line(h)));
    }
    page.push_str(&summary(report));
    if report.daemonsets.is_empty() {
        let _ = writeln!(
            page,
            "<p>{}</p>",
            escape(&no_autoscalers(view, report.history.is_some()))
        );
    }
    page.push_str("<h2>Rows</h2>\n<p><input id=\"filter\" type=\"search\" placeholder=\"filter: words of a node, DaemonSet, container, source…\" aria-label=\"filter the rows\"><span id=\"shown\"></span></p>\n");
    page.push_str("<table id=\"rows\" class=\"sortable\"><thead><tr>");
    for (key, title) in HTML_COLUMNS {
        let _ = write!(page, "<th data-key=\"{key}\">{}</th>", escape(title));
    }
    page.push_str("</tr></thead><tbody>\n");
    for (ds, r) in report.rows_sorted(view.sort) {
        page.push_str(&html_row(ds, r));
        page.push('\n');
    }
    page.push_str("</tbody></table>\n");
    if !report.nodes.is_empty() {
        page.push_str(concat!(
            "<h2>By node</h2><table id=\"nodes\" class=\"sortable\"><thead><tr><th>node</th><th>current</th>",
            "<th>target</th><th>frees</th><th>needs</th><th>OOM</th></tr></thead><tbody>\n"
        ));
        for n in &report.nodes {
            let t = n.totals;
            let _ = writeln!(
                page,
                "<tr><td>{}</td>{}{}{}{}{}</tr>",
                escape(&n.node),
                td_num(
                    &delta_pair(n.current),
                    n.current.cpu_millis,
                    n.current.memory_bytes
                ),
                td_num(&delta_pair(n.target), n.target.cpu_millis, n.target.memory_bytes),
                td_num(
                    &format!("{} / {}", cpu(t.cpu_free_millis), memory(t.memory_free_bytes)),
                    t.cpu_free_millis,
                    t.memory_free_bytes
                ),
                td_num(
                    &format!("{} / {}", cpu(t.cpu_needed_millis), memory(t.memory_needed_bytes)),
                    t.cpu_needed_millis,
                    t.memory_needed_bytes
                ),
                td_num(&t.oom_kills.to_string(), t.oom_kills, 0),
            );
        }
        page.push_str("</tbody></table>\n");
    }
    if report.daemonsets.iter().any(|d| !d.rows.is_empty()) {
        page.push_str("<h2>By DaemonSet</h2>\n");
        page.push_str(concat!(
            "<p class=\"legend\"><span style=\"color:#9e9e9e\">&#9632; current request</span>",
            "<span style=\"color:#1f77b4\">&#9632; target</span><span>&#9473; lower–upper bound</span>",
            "<span style=\"color:#d62728\">┆ template</span></p>\n"
        ));
    }
    for ds in report.daemonsets.iter().filter(|d| !d.rows.is_empty()) {
        let _ = writeln!(
            page,
            "<details><summary>DaemonSet {}/{} (autoscaler {}, mode {}): {}</summary>",
            escape(&ds.namespace),
            escape(&ds.daemonset),
            escape(&ds.autoscaler),
            escape(&ds.mode),
            escape(&totals_line(&ds.totals))
        );
        page.push_str(&chart(ds, Axis::Cpu));
        page.push_str(&chart(ds, Axis::Memory));
        page.push_str("</details>\n");
    }
    let _ = write!(page, "<script>{SCRIPT}</script>\n</body></html>\n");
    out.write_all(page.as_bytes())
}
