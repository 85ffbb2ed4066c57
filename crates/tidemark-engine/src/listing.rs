//! A bucket's listing at the bucket's parallel rate: the keys under a prefix, in byte order, one
//! page at a time — exactly what one sequential stream of LIST pages gives — but listed as
//! several disjoint key ranges at once.
//!
//! A LIST page costs a round trip (50–200 ms on a real bucket), however fast the client; one
//! stream of pages is that latency times the number of pages. Here the listing starts as one
//! range; a range that answers a full page is cut between its last key and its end (keys
//! [`cuts`] guesses from the page), and the parts above are listed at once, each starting after
//! its cut key (`start_after`). At most `ranges` ranges list at a time — one request each in
//! flight — and the pages held or asked for stay within [`AHEAD`] per range of that bound,
//! nearest first, so memory is constant in the number of keys. Pages are handed out in key
//! order: the front range's first, and a range's pages only once every range before it has ended.
//!
//! Pages are used in key order, so the work in flight must lie within that window of pages
//! ahead of their use: parts are short ([`PART_PAGES`]) and the rest of a range stays one part,
//! cut again when it is reached. Measured on tokio's paused clock (`tests/listing_pace.rs`,
//! 1,000,000 keys, 100 ms a page, 16 ranges): 7.7 s flat keys, 8.4 s random hex keys, 20.3 s
//! directories whose names the cuts cannot foresee, against 100 s as one stream.
//!
//! A range's upper bound is applied here (a LIST has no end key on S3): its listing stops at the
//! first key past it, which the next range lists. A split key need not be a key of the bucket;
//! a poor guess costs one LIST of an empty range. Stores whose `start_after` is not served by the
//! store itself ([`RemoteStorage::lists_from_anywhere`], Azure) are listed as one range.

use std::collections::VecDeque;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use tidemark_core::remote::{ListPage, RemoteObject};
use tidemark_core::{RemoteStorage, Result};

/// Pages listed ahead of their use, per range of the bound (the nearest ranges first): 16
/// ranges hold at most 128 pages, and fill them with 16 parts of [`PART_PAGES`] at once.
pub const AHEAD: usize = 8;

/// The parts the listing's first full page cuts: spans doubling from [`PART_PAGES`], as nothing
/// yet says how far the keys reach (a small bucket costs a LIST or two past its keys, no more).
const FIRST_CUTS: usize = 4;

/// The default bound on ranges listed at once.
pub const DEFAULT_RANGES: usize = 16;

struct Range {
    id: u64,
    /// Keys after this one (`None`: from the prefix's start) ...
    after: Option<String>,
    /// ... up to and including this one (`None`: to the prefix's end).
    through: Option<String>,
    /// The store's token for the next page (`None` before the first).
    token: Option<String>,
    pages: VecDeque<Vec<RemoteObject>>,
    /// Full pages it answered: a part made by a cut is cut again only after its second (most
    /// parts are a couple of pages; cutting them on their first would cost a LIST per part).
    full_pages: u32,
    asking: bool,
    done: bool,
}

impl Range {
    /// The keys after `after` up to and including `through`, not yet asked for.
    fn new(id: u64, after: Option<String>, through: Option<String>) -> Range {
        Range { id, after, through, token: None, pages: VecDeque::new(), full_pages: 0, asking: false, done: false }
    }
}

/// The listing of the keys under a prefix, as disjoint ranges listed at once.
pub struct Listing<'a> {
    storage: &'a dyn RemoteStorage,
    prefix: String,
    page: usize,
    max_ranges: usize,
    ranges: VecDeque<Range>,
    asked: FuturesUnordered<BoxFuture<'a, (u64, Result<ListPage>)>>,
    next_id: u64,
    /// LIST requests made.
    pub requests: u64,
    /// Parts cut from a range that held none of its keys (a guess past them).
    missed: u64,
    /// Parts cut from a range whose first page held keys.
    found: u64,
    /// Ranges the listing was split into (1 if it was never split).
    pub splits: u64,
}

impl<'a> Listing<'a> {
    /// The keys under `prefix`, `page` at a time, at most `ranges` ranges at once (1: one
    /// sequential stream of pages).
    pub fn new(storage: &'a dyn RemoteStorage, prefix: &str, page: usize, ranges: usize) -> Self {
        let max_ranges = if storage.lists_from_anywhere() { ranges.max(1) } else { 1 };
        Listing {
            storage,
            prefix: prefix.to_string(),
            page: page.max(1),
            max_ranges,
            ranges: VecDeque::from([Range::new(0, None, None)]),
            asked: FuturesUnordered::new(),
            next_id: 1,
            requests: 0,
            missed: 0,
            found: 0,
            splits: 1,
        }
    }

    /// The next page of keys, in key order; `None` once every key was listed. A failed LIST
    /// fails the listing (a reconcile is retried whole).
    pub async fn next_page(&mut self) -> Result<Option<Vec<RemoteObject>>> {
        loop {
            match self.ranges.front_mut() {
                None => return Ok(None),
                Some(front) => {
                    if let Some(p) = front.pages.pop_front() {
                        return Ok(Some(p));
                    }
                    if front.done {
                        self.ranges.pop_front();
                        continue;
                    }
                }
            }
            self.ask();
            let Some((id, answer)) = self.asked.next().await else {
                unreachable!("the front range is listing or has a page")
            };
            self.take(id, answer?);
        }
    }

    /// Asks for the next page of every range that may list ahead, nearest first, while the
    /// pages held and asked for are within [`AHEAD`] per range of the bound.
    fn ask(&mut self) {
        let budget = AHEAD * self.max_ranges;
        let mut held: usize = self.ranges.iter().map(|r| r.pages.len() + usize::from(r.asking)).sum();
        for r in self.ranges.iter_mut() {
            if r.asking || r.done {
                continue;
            }
            if held >= budget {
                break;
            }
            held += 1;
            r.asking = true;
            self.requests += 1;
            let (storage, prefix, page, id) = (self.storage, self.prefix.clone(), self.page, r.id);
            let (after, token) = (r.after.clone(), r.token.clone());
            self.asked.push(Box::pin(async move {
                let answer = match &token {
                    Some(t) => storage.list(&prefix, None, Some(t), page).await,
                    None => storage.list(&prefix, after.as_deref(), None, page).await,
                };
                (id, answer)
            }));
        }
    }

    /// A range's page: kept up to its bound, and the range split if it was full.
    fn take(&mut self, id: u64, answer: ListPage) {
        let Some(i) = self.ranges.iter().position(|r| r.id == id) else { return };
        let full = answer.objects.len() >= self.page;
        // Ranges still listing count against the bound (the pages of ended ones are bounded
        // by [`AHEAD`]; an ended, empty one is dropped below: a cut guessed past the keys
        // costs one LIST, not a slot).
        let listing = self.ranges.iter().filter(|r| !r.done).count();
        let room = listing < self.max_ranges;
        let r = &mut self.ranges[i];
        r.asking = false;
        let mut objects = answer.objects;
        // (A store's start_after is exclusive; a key at or before it is not this range's.)
        if let Some(a) = &r.after {
            objects.retain(|o| o.key.as_str() > a.as_str());
        }
        if let Some(t) = &r.through
            && let Some(past) = objects.iter().position(|o| o.key.as_str() > t.as_str())
        {
            objects.truncate(past);
            r.done = true;
        }
        let first_of_a_part = r.token.is_none() && r.after.is_some();
        r.done |= answer.next.is_none();
        r.token = answer.next;
        // Did the guess that cut this part find keys?
        if first_of_a_part {
            if objects.is_empty() && r.done {
                self.missed += 1;
            } else {
                self.found += 1;
            }
        }
        if full {
            r.full_pages += 1;
        }
        if !objects.is_empty() {
            r.pages.push_back(objects);
        } else if r.done && r.pages.is_empty() {
            self.ranges.remove(i);
            return;
        }
        // A full page: the rest of this range is likely large. Its upper parts are listed at
        // once, as many as there is room for ([`cuts`]).
        if full && !r.done && room && r.full_pages >= if r.id == 0 { 1 } else { 2 } {
            let keys: Vec<&str> =
                r.pages.back().map(|p| p.iter().map(|o| o.key.as_str()).collect()).unwrap_or_default();
            // Where more than one guess in five landed past the keys, parts reach further.
            let first = r.id == 0 && r.full_pages == 1;
            let n = if first { FIRST_CUTS.min(self.max_ranges - listing) } else { self.max_ranges - listing };
            let cuts = cuts(&keys, r.through.as_deref(), n, first || 4 * self.missed > self.found);
            let Some(nearest) = cuts.first().cloned() else { return };
            // This range now ends at the nearest cut; the parts above it are (cut_1, cut_2], …,
            // (cut_n, the range's old end].
            let old_through = r.through.replace(nearest);
            let ends = cuts.iter().skip(1).cloned().map(Some).chain([old_through]);
            for (at, (after, through)) in (i + 1..).zip(cuts.iter().cloned().zip(ends)) {
                self.ranges.insert(at, Range::new(self.next_id, Some(after), through));
                self.next_id += 1;
                self.splits += 1;
            }
        }
    }
}

/// The characters a key position is taken to hold, smallest set first: the one that holds
/// every character a page had there.
const ALPHABETS: [&str; 7] = [
    "0123456789",
    "0123456789abcdef",
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789abcdefghijklmnopqrstuvwxyz",
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    " !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~",
];

/// The pages a part cut from a range is guessed to hold. Each part costs a LIST more than its
/// pages (its last page ends short, or it lists nothing), so short parts cost requests; but
/// parts must be short for [`AHEAD`]'s window to hold a part per range. Four: at 1,000,000 keys
/// 3% more LISTs than one stream (flat keys; 13% random hex; 50% directories the cuts cannot
/// foresee, where half the guesses land past the keys).
const PART_PAGES: u128 = 4;

/// Up to `n` keys, ascending, strictly between `last` and `hi` (`None`: no bound), at which to
/// cut the rest of a range whose full page is `page` (its keys in order). The keys beyond are
/// guessed to lie as densely as the page's: the few characters from just before where its keys
/// differ are read as a number, each position in the smallest alphabet that holds what the page
/// had there (digits, hex, letters, …); cuts are every [`PART_PAGES`] pages' span past the last
/// key — or, when `grow` (the guesses have been landing past the keys), at spans doubling each
/// time, fewer parts reaching as far. The last part is the rest of the range, cut again when it
/// fills a page (unless it has fewer than two parts' pages left: no cut). Where that does not
/// apply (characters outside printable ASCII, a page of one key) one cut halves the way from the
/// last key to the bound instead ([`between`]). A cut past the keys costs one LIST of an empty
/// range; a cut never changes which keys are listed, only how the work is shared.
pub fn cuts(page: &[&str], hi: Option<&str>, n: usize, grow: bool) -> Vec<String> {
    const POSITIONS: usize = 6;
    let (Some(first), Some(last)) = (page.first(), page.last()) else { return Vec::new() };
    let mut out: Vec<String> = Vec::new();
    let common = first.chars().zip(last.chars()).take_while(|(a, b)| a == b).count();
    // Two positions above the first difference, for the carries.
    let from = common.saturating_sub(2);
    let prefix: String = last.chars().take(from).collect();
    let tails: Vec<Vec<char>> = page.iter().map(|k| k.chars().skip(from).take(POSITIONS).collect()).collect();
    let alphabets: Option<Vec<Vec<char>>> = (0..POSITIONS)
        .map(|i| {
            let seen: Vec<char> = tails.iter().filter_map(|t| t.get(i).copied()).collect();
            ALPHABETS.iter().find(|a| seen.iter().all(|c| a.contains(*c))).map(|a| a.chars().collect())
        })
        .collect();
    if let Some(alphabets) = alphabets
        && first != last
    {
        // Position i holds 0 (the key ended) or 1 + the character's place in its alphabet.
        let number = |tail: &[char]| -> Option<u128> {
            let mut v = 0u128;
            for (i, a) in alphabets.iter().enumerate() {
                let d = match tail.get(i) {
                    None => 0,
                    Some(c) => 1 + a.iter().position(|x| x == c)? as u128,
                };
                v = v * (a.len() as u128 + 1) + d;
            }
            Some(v)
        };
        let key_of = |mut v: u128| -> String {
            let mut digits = vec![0usize; alphabets.len()];
            for (i, a) in alphabets.iter().enumerate().rev() {
                let base = a.len() as u128 + 1;
                digits[i] = (v % base) as usize;
                v /= base;
            }
            let end = digits.iter().rposition(|d| *d != 0).map_or(0, |i| i + 1);
            // (An ended position before the end is a character too: its alphabet's smallest.)
            let tail: String = digits[..end].iter().zip(&alphabets).map(|(d, a)| a[d.max(&1) - 1]).collect();
            format!("{prefix}{tail}")
        };
        let max: u128 = alphabets.iter().map(|a| a.len() as u128 + 1).product();
        let (f, l) = (number(&tails[0]), number(&tails[tails.len() - 1]));
        if let (Some(f), Some(l)) = (f, l)
            && l > f
        {
            let span = l - f;
            // A range with a few pages left is not worth cutting: each part costs a LIST.
            let left = hi.filter(|h| h.starts_with(&prefix)).and_then(|h| {
                let t: Vec<char> = h.chars().skip(from).take(POSITIONS).collect();
                number(&t)
            });
            if left.is_some_and(|h| h.saturating_sub(l) < 2 * PART_PAGES * span) {
                return out;
            }
            let mut step = PART_PAGES * span;
            while out.len() < n {
                let Some(v) = l.checked_add(step).filter(|v| *v < max) else { break };
                let key = key_of(v);
                let after = out.last().map_or(*last, String::as_str);
                if key.as_str() <= after || hi.is_some_and(|h| key.as_str() >= h) {
                    break;
                }
                out.push(key);
                step = step.saturating_add(if grow { step } else { PART_PAGES * span });
            }
            if !out.is_empty() {
                return out;
            }
        }
    }
    // Halfway to the bound: one cut, as nothing says where the keys lie (each guess past them
    // costs a LIST).
    out.extend(between(last, hi).filter(|_| n > 0));
    out
}

/// A key strictly between `lo` and `hi` (`None`: no upper bound), near the middle of the keys
/// that could lie there — or `None` if none is worth listing from. Keys compare as bytes, and
/// UTF-8's byte order is its code points' order, so the middle is found on code points: the
/// first one where the two differ, halved. Without an upper bound the middle of printable ASCII
/// is tried first (most keys are ASCII; a wrong guess costs one empty LIST). Never a control
/// character or a surrogate.
pub fn between(lo: &str, hi: Option<&str>) -> Option<String> {
    const PRINTABLE: u32 = 0x20;
    let lo: Vec<char> = lo.chars().collect();
    let mut hi: Option<Vec<char>> = hi.map(|h| h.chars().collect());
    let mut key = String::new();
    for i in 0.. {
        let a = lo.get(i).map(|c| *c as u32);
        let b = match &hi {
            Some(h) => Some(h.get(i).map(|c| *c as u32)?), // `hi` ended: nothing lies between
            None => None,
        };
        let low = a.unwrap_or(PRINTABLE - 1); // past `lo`'s end: any character follows it
        let high = b.unwrap_or(if low < 0x7E { 0x7F } else { char::MAX as u32 + 1 });
        if high > low + 1 {
            let mut c = low + (high - low) / 2;
            if c < PRINTABLE {
                c = PRINTABLE;
            }
            if (0xD800..0xE000).contains(&c) {
                c = 0xE000;
            }
            if c <= low || c >= high {
                return None;
            }
            key.push(char::from_u32(c)?);
            return Some(key);
        }
        let a = a?;
        if b.is_some_and(|b| b < a) {
            return None; // `lo` is not below `hi`
        }
        key.push(char::from_u32(a)?);
        if b == Some(a + 1) {
            // Everything after `lo`'s character here is below `hi` from now on.
            hi = None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_key_lies_strictly_between_its_bounds() {
        for (lo, hi) in [
            ("k000999", None),
            ("k000999", Some("u")),
            ("k", Some("l")),
            ("a/zzz", Some("a0")),
            ("", Some("b")),
            ("x\u{7F}", None),
            ("é", None),
            ("日本", Some("日本語")),
            ("a\u{1}", Some("a\u{3}")),
        ] {
            if let Some(m) = between(lo, hi) {
                assert!(lo < m.as_str() && hi.is_none_or(|h| m.as_str() < h), "{lo:?} < {m:?} < {hi:?}");
                assert!(!m.chars().any(|c| c.is_control()), "{m:?}");
            }
        }
        assert_eq!(between("k000999", None).as_deref(), Some("u"));
        assert_eq!(between("k", Some("l")).as_deref(), Some("kO"));
        assert!(between("a", Some("a\u{0}")).is_none(), "nothing lies between");
    }
}
