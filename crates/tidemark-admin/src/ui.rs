//! The Admin UI: server-rendered pages that refresh themselves (a `<meta refresh>`, no
//! JavaScript), readable in any browser or with `curl`. Every value a test or a script may want
//! sits in an element with a stable `id` or `data-field`.

use std::fmt::Write;

use tidemark_core::cache::{CacheStats, human_bytes};
use tidemark_core::format_rfc3339_ms;
use tidemark_core::jobs::REMOTE_EVENTS;
use tidemark_engine::slice::{ReconcileKind, SliceState};

use crate::scheduler::{Scheduler, Tracked};
use crate::snapshot::Snapshot;

/// How often the pages reload themselves, seconds.
const REFRESH_SECS: u32 = 2;

pub fn escape(s: &str) -> String {
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

pub fn state_name(s: SliceState) -> &'static str {
    match s {
        SliceState::Idle => "idle",
        SliceState::Reconciling => "reconciling",
        SliceState::Tailing => "tailing",
        SliceState::Errored => "errored",
    }
}

fn kind_name(k: ReconcileKind) -> &'static str {
    match k {
        ReconcileKind::Baseline => "baseline",
        ReconcileKind::Gap => "gap",
        ReconcileKind::Scheduled => "scheduled",
    }
}

/// `12 s ago`, `3 min ago`, `in 4 s`.
pub fn ago(then_ms: i64, now_ms: i64) -> String {
    let d = (now_ms - then_ms) / 1000;
    let (n, future) = if d < 0 { (-d, true) } else { (d, false) };
    let text = match n {
        0..=59 => format!("{n} s"),
        60..=3599 => format!("{} min", n / 60),
        3600..=86_399 => format!("{} h", n / 3600),
        _ => format!("{} d", n / 86_400),
    };
    if future { format!("in {text}") } else { format!("{text} ago") }
}

fn time_cell(ms: i64, now_ms: i64) -> String {
    format!(
        "<time datetime=\"{}\" title=\"{}\">{}</time>",
        format_rfc3339_ms(ms),
        format_rfc3339_ms(ms),
        ago(ms, now_ms)
    )
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f23;background:#f6f8fa}\
header{background:#0b3d5c;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:center}\
header a{color:#cde;text-decoration:none}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #7cc4ff}\
header .brand{font-weight:700;font-size:16px;color:#fff}main{padding:16px 20px}\
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}\
th,td{border:1px solid #d0d7de;padding:5px 8px;text-align:left;vertical-align:top}th{background:#eef2f5}\
td.num{text-align:right;font-variant-numeric:tabular-nums}.state{font-weight:600;padding:1px 6px;border-radius:8px}\
.tailing{background:#dafbe1;color:#116329}.reconciling{background:#fff8c5;color:#7d4e00}\
.errored{background:#ffebe9;color:#a40e26}.idle{background:#eaeef2;color:#57606a}\
.err{color:#a40e26;max-width:28em;word-break:break-word}.muted{color:#57606a}code{font-size:12px}\
p.empty{background:#fff;border:1px dashed #d0d7de;padding:16px}button{padding:3px 10px}";

/// What a standby admin's pages say first: read-only here, and where the active admin is.
pub fn standby_banner(active: Option<&str>) -> String {
    let which = match active {
        Some(a) => format!("the active admin is <a id=\"active-admin\" href=\"{url}\">{url}</a>", url = escape(a)),
        None => "no admin is active yet".into(),
    };
    format!(
        "<p id=\"standby\" class=\"empty\" style=\"border-color:#bf8700;background:#fff8c5\">This admin is \
         standing by: its pages are read-only and it schedules nothing; {which}. It takes over if that one stops.</p>"
    )
}

fn page(title: &str, active: &str, body: &str, filer: &str) -> String {
    let nav = [
        ("subscriptions", "/subscriptions", "Event Subscriptions"),
        ("job-types", "/job-types", "Job types"),
        ("workers", "/workers", "Workers"),
        ("cache", "/cache", "Content cache"),
    ];
    let mut links = String::new();
    for (id, href, label) in nav {
        let class = if id == active { " class=\"on\"" } else { "" };
        let _ = write!(links, "<a id=\"nav-{id}\" href=\"{href}\"{class}>{label}</a>");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <title>{title} · Tidemark admin</title><style>{STYLE}</style></head>\
         <body><header><span class=\"brand\">Tidemark admin</span>{links}<a href=\"/metrics\">/metrics</a>\
         <span class=\"muted\" style=\"margin-left:auto;color:#9bc\">filer {filer}</span></header>\
         <main><h1 style=\"font-size:18px\">{title}</h1>{body}</main></body></html>\n",
        title = escape(title),
        filer = escape(filer),
    )
}

/// What the subscriptions' requests cost: their rates, and the prices.
pub struct Costs<'a> {
    pub rates: &'a crate::rates::RequestRates,
    pub prices: &'a tidemark_core::requests::Prices,
}

impl Costs<'_> {
    /// The cell of a subscription's requests per hour and their price at `kind`'s prices.
    fn cell(&self, fingerprint: &str, kind: Option<tidemark_core::remote::StorageKind>) -> String {
        use tidemark_core::remote::StorageKind;
        let Some((rate, span_ms)) = self.rates.per_hour(fingerprint) else {
            return "<span class=\"muted\" data-field=\"requests-per-hour\">not seen long enough yet</span>".into();
        };
        let ops: Vec<String> =
            rate.iter().filter(|(_, n)| **n >= 0.5).map(|(op, n)| format!("{op} {}", n.round() as u64)).collect();
        let ops = if ops.is_empty() { "none".to_string() } else { ops.join(", ") };
        let provider = match kind {
            Some(StorageKind::S3) => Some("s3"),
            Some(StorageKind::Gcs) => Some("gcs"),
            Some(StorageKind::Azure) => Some("azure"),
            Some(StorageKind::Local) | None => None,
        };
        let price = match provider {
            None => "<span class=\"muted\">no price (not a cloud bucket)</span>".to_string(),
            Some(p) => {
                let (usd, unpriced) = self.prices.cost(p, &rate);
                let missing = if unpriced.is_empty() {
                    String::new()
                } else {
                    format!(" <span class=\"muted\">(no price for {})</span>", escape(&unpriced.join(", ")))
                };
                format!("<span data-field=\"cost-per-hour\">${usd:.4}</span>/h at {p} list prices{missing}")
            }
        };
        format!(
            "<span data-field=\"requests-per-hour\">{ops}</span><br>{price}<br><span class=\"muted\">over the last {}</span>",
            span(span_ms)
        )
    }
}

/// `42 min`, `1 h`, `35 s`.
fn span(ms: i64) -> String {
    match ms / 1000 {
        s if s < 120 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        _ => "1 h".into(),
    }
}

pub fn subscriptions(snap: &Snapshot, sched: &Scheduler, costs: &Costs, filer: &str, now_ms: i64) -> String {
    let mut b = String::new();
    if !sched.enabled() {
        b.push_str("<p class=\"empty\" id=\"job-type-off\">The <code>remote_events</code> job type is disabled: no slices run. \
                    Enable it on the <a href=\"/job-types\">Job types</a> page.</p>");
    }
    for p in &snap.problems {
        let _ = write!(b, "<p class=\"err\">{}</p>", escape(p));
    }
    if snap.subscriptions.is_empty() {
        b.push_str(
            "<p class=\"empty\" id=\"no-subscriptions\">No event subscriptions yet. Mount a bucket and run \
                    <code>remote.events.enable -dir=/mnt/data</code> in <code>tidemark shell</code>.</p>",
        );
        return page("Event Subscriptions", "subscriptions", &b, filer);
    }
    b.push_str("<table id=\"subscriptions\"><thead><tr><th>Directory</th><th>Topology</th><th>Queue</th><th>Bucket / prefix</th>\
                <th>Events</th><th>State</th><th>Received</th><th>Applied</th><th>Failed</th><th>Echo suppressed</th><th title=\"keys a file or directory stands in the way of\">Shadowed</th><th title=\"messages waiting in the dead-letter queue\">Dead letters</th>\
                <th>Ignored</th><th title=\"requests to the bucket and the queue, per hour, and their price\">Requests / hour</th><th>Lag (last / max)</th><th>Last reconcile</th><th>Lease</th><th>Slice</th><th>Last error</th>\
                </tr></thead><tbody>");
    for v in &snap.subscriptions {
        let d = &v.doc;
        let c = v.status.as_ref().map(|s| s.counters.clone()).unwrap_or_default();
        let state = v.status.as_ref().map_or(SliceState::Idle, |s| s.state);
        let lag = |x: Option<i64>| x.map_or("–".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
        let reconcile = match v.status.as_ref().and_then(|s| s.last_reconcile) {
            Some((k, at)) => {
                format!("<span data-field=\"reconcile-kind\">{}</span> {}", kind_name(k), time_cell(at, now_ms))
            }
            None => "<span data-field=\"reconcile-kind\" class=\"muted\">none yet</span>".into(),
        };
        let lease = match &v.lease {
            Some(l) if l.expires_at_ms > now_ms => format!(
                "<span data-field=\"lease-holder\">{}</span> gen <span data-field=\"lease-generation\">{}</span><br><span class=\"muted\">expires {}</span>",
                escape(&l.holder),
                l.generation,
                ago(l.expires_at_ms, now_ms)
            ),
            Some(l) => format!(
                "<span class=\"muted\">free (last: {} gen <span data-field=\"lease-generation\">{}</span>)</span>",
                escape(&l.holder),
                l.generation
            ),
            None => "<span class=\"muted\">never taken</span>".into(),
        };
        let slice = match sched.job_of(&d.fingerprint) {
            // Cancelled at the worker's next heartbeat; it ends cleanly and reports.
            Some(Tracked::Assigned { job, worker, .. }) if !sched.is_wanted(job) => format!(
                "<span data-field=\"slice\">stopping</span> on {} <span class=\"muted\">({})</span>",
                escape(worker),
                escape(&job.id)
            ),
            Some(Tracked::Assigned { job, worker, since_ms, .. }) => format!(
                "<span data-field=\"slice\">running</span> on {} <span class=\"muted\">({}, since {})</span>",
                escape(worker),
                escape(&job.id),
                ago(*since_ms, now_ms)
            ),
            Some(Tracked::Pending { since_ms, .. }) => {
                format!(
                    "<span data-field=\"slice\">waiting for a worker</span> <span class=\"muted\">since {}</span>",
                    ago(*since_ms, now_ms)
                )
            }
            None => match sched.retry_of(&d.fingerprint) {
                Some(r) if r.not_before_ms > now_ms => format!(
                    "<span data-field=\"slice\">retry {}</span> <span class=\"muted\">(last {})</span>",
                    ago(r.not_before_ms, now_ms),
                    r.last_outcome.as_str()
                ),
                _ => "<span data-field=\"slice\" class=\"muted\">none</span>".into(),
            },
        };
        let error = v
            .status
            .as_ref()
            .and_then(|s| s.last_error.clone())
            .or_else(|| sched.retry_of(&d.fingerprint).and_then(|r| r.last_error.clone()));
        let prefix =
            if d.identity.prefix.is_empty() { String::new() } else { format!("/{}", escape(&d.identity.prefix)) };
        let _ = write!(
            b,
            "<tr id=\"sub-{fp}\" data-fingerprint=\"{fp}\"><td data-field=\"dir\"><code>{dir}</code></td><td data-field=\"topology\">{topo}</td>\
             <td data-field=\"queue\"><code>{queue}</code></td><td data-field=\"bucket\"><code>{bucket}{prefix}</code></td>\
             <td data-field=\"events\">{events}</td><td><span data-field=\"state\" class=\"state {state}\">{state}</span></td>\
             <td class=\"num\" data-field=\"received\">{rec}</td><td class=\"num\" data-field=\"applied\">{app}</td>\
             <td class=\"num\" data-field=\"failed\">{fail}</td><td class=\"num\" data-field=\"echo_suppressed\">{echo}</td><td class=\"num\" data-field=\"shadowed\">{shadowed}</td><td class=\"num\" data-field=\"dead_lettered\">{dead}</td>\
             <td class=\"num\" data-field=\"ignored\">{ign}</td><td data-field=\"requests\">{requests}</td><td class=\"num\" data-field=\"lag\">{lag_last} / {lag_max}</td>\
             <td>{reconcile}</td><td>{lease}</td><td>{slice}</td><td class=\"err\" data-field=\"last-error\">{error}</td></tr>",
            fp = escape(&d.fingerprint),
            dir = escape(&d.dir),
            topo = d.identity.topology.as_str(),
            queue = escape(&d.identity.queue),
            bucket = escape(&d.identity.bucket),
            events = escape(&d.identity.event_types.describe()),
            state = state_name(state),
            rec = c.received,
            app = c.applied,
            fail = c.failed,
            echo = c.echo_suppressed,
            shadowed = c.shadowed,
            dead = v.status.as_ref().and_then(|s| s.dead_lettered).map_or("–".to_string(), |n| n.to_string()),
            ign = c.ignored,
            requests = costs.cell(&d.fingerprint, v.kind),
            lag_last = lag(c.last_lag_ms),
            lag_max = lag(c.max_lag_ms),
            error = error.map(|e| escape(&e)).unwrap_or_default(),
        );
    }
    b.push_str("</tbody></table>");
    let recent: Vec<_> = sched.recent().take(15).collect();
    if !recent.is_empty() {
        b.push_str("<h2 style=\"font-size:15px\">Recent slices</h2><table id=\"recent\"><thead><tr><th>Ended</th><th>Directory</th>\
                    <th>Worker</th><th>Outcome</th><th>Duration</th><th>Error</th></tr></thead><tbody>");
        for f in recent {
            let _ = write!(
                b,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td data-field=\"outcome\">{}</td><td class=\"num\">{:.1} s</td><td class=\"err\">{}</td></tr>",
                time_cell(f.at_ms, now_ms),
                escape(&f.report.job.dir),
                escape(&f.worker),
                f.report.outcome.as_str(),
                f.report.duration_ms as f64 / 1000.0,
                f.report.error.as_deref().map(escape).unwrap_or_default()
            );
        }
        b.push_str("</tbody></table>");
    }
    page("Event Subscriptions", "subscriptions", &b, filer)
}

pub fn job_types(sched: &Scheduler, subscriptions: usize, filer: &str) -> String {
    let enabled = sched.enabled();
    let (state, action, label) = if enabled { ("enabled", "false", "Disable") } else { ("disabled", "true", "Enable") };
    let b = format!(
        "<table id=\"job-types\"><thead><tr><th>Job type</th><th>What it does</th><th>State</th><th>Subscriptions</th><th>Slices running</th><th></th></tr></thead>\
         <tbody><tr id=\"job-type-{REMOTE_EVENTS}\"><td><code>{REMOTE_EVENTS}</code></td>\
         <td>Tails each event subscription's queue in fenced slices and applies the changes; baseline, gap and scheduled reconciles.</td>\
         <td><span data-field=\"state\" class=\"state {cls}\">{state}</span></td><td class=\"num\">{subscriptions}</td>\
         <td class=\"num\" data-field=\"running\">{running}</td>\
         <td><form method=\"post\" action=\"/job-types\"><input type=\"hidden\" name=\"job_type\" value=\"{REMOTE_EVENTS}\">\
         <input type=\"hidden\" name=\"enabled\" value=\"{action}\"><button id=\"toggle-{REMOTE_EVENTS}\" type=\"submit\">{label}</button></form></td></tr></tbody></table>\
         <p class=\"muted\">Disabling ends running slices cleanly (status written, lease released) and proposes no more; it is kept in the filer \
         (<code>{doc}</code>), so it survives restarts of the admin.</p>",
        cls = if enabled { "tailing" } else { "idle" },
        running = sched.running_jobs(),
        doc = tidemark_core::jobs::JOB_TYPES_DOC,
    );
    page("Job types", "job-types", &b, filer)
}

pub fn workers(sched: &Scheduler, filer: &str, now_ms: i64) -> String {
    let workers = sched.workers();
    let mut b = String::new();
    if workers.is_empty() {
        b.push_str("<p class=\"empty\" id=\"no-workers\">No workers. Start one with \
                    <code>tidemark worker --admin ADDR --filer ADDR</code> (<code>tidemark server</code> runs one itself).</p>");
        return page("Workers", "workers", &b, filer);
    }
    b.push_str("<table id=\"workers\"><thead><tr><th>Worker</th><th>Host</th><th>Capabilities</th><th>Slots (busy / max)</th>\
                <th>Running</th><th>State</th><th>Last heartbeat</th><th>Registered</th><th>Jobs done</th></tr></thead><tbody>");
    for w in workers {
        let running: Vec<String> = w.running.iter().map(|j| format!("<code>{}</code>", escape(&j.dir))).collect();
        let _ = write!(
            b,
            "<tr id=\"worker-{id}\"><td data-field=\"worker\">{id}</td><td>{host}</td><td>{caps}</td>\
             <td class=\"num\" data-field=\"slots\">{busy} / {max}</td><td>{running}</td><td data-field=\"state\">{state}</td>\
             <td>{hb}</td><td>{reg}</td><td class=\"num\">{done}</td></tr>",
            id = escape(&w.worker_id),
            host = escape(&w.host),
            caps = escape(&w.capabilities.join(", ")),
            busy = w.running.len(),
            max = w.max_execute,
            running = running.join("<br>"),
            state = if w.draining { "draining" } else { "active" },
            hb = time_cell(w.last_heartbeat_ms, now_ms),
            reg = time_cell(w.registered_at_ms, now_ms),
            done = w.jobs_done,
        );
    }
    b.push_str("</tbody></table>");
    page("Workers", "workers", &b, filer)
}

/// The filer's content cache: its use against the budget and its counters since the filer
/// started (`stats`), or why the filer could not say.
pub fn cache(stats: Result<&CacheStats, String>, filer: &str) -> String {
    let s = match stats {
        Ok(s) => s,
        Err(why) => {
            let body =
                format!("<p class=\"err\" id=\"cache-error\">The filer did not report its cache: {}</p>", escape(&why));
            return page("Content cache", "cache", &body, filer);
        }
    };
    let mut b = String::new();
    if s.budget_bytes == 0 {
        b.push_str("<p class=\"empty\" id=\"cache-off\">The content cache is off (<code>--cache-size 0</code>): every read of a \
                    remote-backed file goes to its bucket.</p>");
    }
    let pct = |n: u64, d: u64| if d == 0 { "–".to_string() } else { format!("{:.1}%", n as f64 * 100.0 / d as f64) };
    let rows: [(&str, &str, String); 12] = [
        ("resident", "Resident", format!("{} in {} chunks", human_bytes(s.resident_bytes), s.resident_chunks)),
        ("budget", "Budget (--cache-size)", human_bytes(s.budget_bytes)),
        ("use", "Use of the budget", pct(s.resident_bytes, s.budget_bytes)),
        ("hits", "Hits (chunks served from the cache)", s.hits.to_string()),
        ("misses", "Misses (chunks fetched from buckets)", s.misses.to_string()),
        ("hit-ratio", "Hit ratio", pct(s.hits, s.hits + s.misses)),
        ("served", "Bytes served from the cache", human_bytes(s.bytes_served)),
        ("fetched", "Bytes fetched from buckets", human_bytes(s.bytes_fetched)),
        ("evictions", "Evictions", format!("{} chunks ({})", s.evictions, human_bytes(s.evicted_bytes))),
        ("read-back", "Read back (chunks fetched ahead, then read from the disk)", s.read_back.to_string()),
        ("resumed", "Resumed (GETs that went on where a bucket's stream broke)", s.resumed.to_string()),
        ("chunk", "Chunk size (--cache-chunk-size)", human_bytes(s.chunk_bytes)),
    ];
    b.push_str("<table id=\"cache\" style=\"width:auto\"><tbody>");
    for (id, label, value) in rows {
        let _ = write!(
            b,
            "<tr id=\"cache-{id}\"><th>{label}</th><td class=\"num\" data-field=\"value\">{}</td></tr>",
            escape(&value)
        );
    }
    b.push_str("</tbody></table><p class=\"muted\">Counters since the filer started. <code>remote.cache -dir=D</code> fills the \
                cache, <code>remote.uncache -dir=D</code> empties it; the filer's own <code>/metrics</code> has the same figures.</p>");
    page("Content cache", "cache", &b, filer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_times() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        assert_eq!(ago(0, 12_000), "12 s ago");
        assert_eq!(ago(0, 180_000), "3 min ago");
        assert_eq!(ago(5_000, 1_000), "in 4 s");
    }

    #[test]
    fn requests_per_hour_are_shown_with_their_price() {
        use tidemark_core::remote::StorageKind;
        let mut rates = crate::rates::RequestRates::default();
        let prices = tidemark_core::requests::Prices::list();
        let costs = |r: &crate::rates::RequestRates, k| Costs { rates: r, prices: &prices }.cell("fp", k);
        assert!(costs(&rates, Some(StorageKind::S3)).contains("not seen long enough yet"));
        let at = |list: u64, head: u64, recv: u64| -> std::collections::BTreeMap<String, u64> {
            [("LIST".into(), list), ("HEAD".into(), head), ("RECEIVE".into(), recv)].into()
        };
        rates.record("fp", 0, &at(0, 0, 0));
        rates.record("fp", 1_800_000, &at(500, 5_000, 1_000));
        // Half an hour: 1,000 LISTs, 10,000 HEADs and 2,000 receives an hour — $0.005 + $0.004 + $0.0008.
        let s3 = costs(&rates, Some(StorageKind::S3));
        assert!(s3.contains("HEAD 10000, LIST 1000, RECEIVE 2000"), "{s3}");
        assert!(s3.contains("$0.0098</span>/h at s3 list prices") && s3.contains("30 min"), "{s3}");
        let azure = costs(&rates, Some(StorageKind::Azure));
        assert!(azure.contains("(no price for RECEIVE)"), "{azure}");
        assert!(costs(&rates, Some(StorageKind::Local)).contains("not a cloud bucket"));
    }

    #[test]
    fn empty_pages_say_what_to_do() {
        let s = Scheduler::new(Default::default());
        let (rates, prices) = (crate::rates::RequestRates::default(), tidemark_core::requests::Prices::list());
        let costs = Costs { rates: &rates, prices: &prices };
        let html = subscriptions(&Snapshot::default(), &s, &costs, "127.0.0.1:8888", 0);
        assert!(html.contains("id=\"no-subscriptions\"") && html.contains("remote.events.enable"));
        assert!(workers(&s, "f", 0).contains("tidemark worker --admin"));
        assert!(job_types(&s, 0, "f").contains("Disable"));
        let off = CacheStats::default();
        assert!(cache(Ok(&off), "f").contains("id=\"cache-off\""));
        let used = CacheStats {
            resident_bytes: 512,
            budget_bytes: 1024,
            hits: 3,
            misses: 1,
            read_back: 7,
            resumed: 9,
            ..Default::default()
        };
        let html = cache(Ok(&used), "f");
        assert!(html.contains("50.0%") && html.contains("75.0%") && !html.contains("cache-off"), "{html}");
        assert!(html.contains("id=\"cache-read-back\"") && html.contains(">7<"), "{html}");
        assert!(html.contains("id=\"cache-resumed\"") && html.contains(">9<"), "{html}");
        assert!(cache(Err("<unreachable>".into()), "f").contains("&lt;unreachable&gt;"));
    }
}
