//! Additional checksums (`x-amz-checksum-crc32`, `-crc32c`, `-crc64nvme`, `-sha1`, `-sha256`):
//! what a request carries — a header, an aws-chunked trailer, or only the algorithm for the
//! gateway to compute — verified against the bytes as they stream to the filer (a mismatch
//! fails the write, so nothing is stored), kept with the object as
//! [`object_attrs::CHECKSUM`](tidemark_core::model::object_attrs::CHECKSUM), and answered back.
//!
//! A multipart object's checksum is either of the whole object (`FULL_OBJECT`, the CRCs: the
//! parts' CRCs combined, no byte read twice) or of its parts' checksums (`COMPOSITE`: the digest
//! of the parts' digests, `-N` appended), as S3 defines them.

use std::sync::{Arc, Mutex};

use base64::Engine;
use hyper::HeaderMap;
use s3s::crypto::{Checksum as _, Crc32, Crc32c, Crc64Nvme, Sha1, Sha256};
use s3s::{S3Error, S3ErrorCode, S3Result, TrailingHeaders};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

pub const ALL: [Algo; 5] = [Algo::Crc32, Algo::Crc32c, Algo::Crc64Nvme, Algo::Sha1, Algo::Sha256];

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Crc32 => "CRC32",
            Algo::Crc32c => "CRC32C",
            Algo::Crc64Nvme => "CRC64NVME",
            Algo::Sha1 => "SHA1",
            Algo::Sha256 => "SHA256",
        }
    }

    pub fn parse(s: &str) -> Option<Algo> {
        ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The header (and trailer) that carries it.
    pub fn header(self) -> &'static str {
        match self {
            Algo::Crc32 => "x-amz-checksum-crc32",
            Algo::Crc32c => "x-amz-checksum-crc32c",
            Algo::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algo::Sha1 => "x-amz-checksum-sha1",
            Algo::Sha256 => "x-amz-checksum-sha256",
        }
    }

    fn digest_len(self) -> usize {
        match self {
            Algo::Crc32 | Algo::Crc32c => 4,
            Algo::Crc64Nvme => 8,
            Algo::Sha1 => 20,
            Algo::Sha256 => 32,
        }
    }

    /// The CRCs combine into a checksum of the whole object; the digests do not.
    fn combines(self) -> bool {
        matches!(self, Algo::Crc32 | Algo::Crc32c | Algo::Crc64Nvme)
    }

    /// What a multipart upload of this algorithm makes when the request names no type.
    pub fn default_full_object(self) -> bool {
        self == Algo::Crc64Nvme
    }

    /// Whether a multipart upload may make this kind of checksum (S3: CRC64NVME only of the
    /// whole object, the SHAs only composite).
    pub fn allows(self, full_object: bool) -> bool {
        if full_object { self.combines() } else { self != Algo::Crc64Nvme }
    }

    /// The base64 digest of `data`, as the header carries it.
    pub fn digest_base64(self, data: &[u8]) -> String {
        B64.encode(self.digest(data))
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        let mut r = Running::new(self);
        r.update(data);
        r.finish()
    }

    /// `value` decoded, if it is a digest of this algorithm.
    fn decode(self, value: &str) -> Option<Vec<u8>> {
        B64.decode(value.trim()).ok().filter(|d| d.len() == self.digest_len())
    }
}

/// A hash in progress.
enum Running {
    Crc32(Crc32),
    Crc32c(Crc32c),
    Crc64Nvme(Crc64Nvme),
    Sha1(Sha1),
    Sha256(Sha256),
}

impl Running {
    fn new(a: Algo) -> Self {
        match a {
            Algo::Crc32 => Running::Crc32(Crc32::new()),
            Algo::Crc32c => Running::Crc32c(Crc32c::new()),
            Algo::Crc64Nvme => Running::Crc64Nvme(Crc64Nvme::new()),
            Algo::Sha1 => Running::Sha1(Sha1::new()),
            Algo::Sha256 => Running::Sha256(Sha256::new()),
        }
    }
    fn update(&mut self, d: &[u8]) {
        match self {
            Running::Crc32(h) => h.update(d),
            Running::Crc32c(h) => h.update(d),
            Running::Crc64Nvme(h) => h.update(d),
            Running::Sha1(h) => h.update(d),
            Running::Sha256(h) => h.update(d),
        }
    }
    fn finish(self) -> Vec<u8> {
        match self {
            Running::Crc32(h) => h.finalize().to_vec(),
            Running::Crc32c(h) => h.finalize().to_vec(),
            Running::Crc64Nvme(h) => h.finalize().to_vec(),
            Running::Sha1(h) => h.finalize().as_ref().to_vec(),
            Running::Sha256(h) => h.finalize().as_ref().to_vec(),
        }
    }
}

/// The checksum of an object or a part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sum {
    pub algo: Algo,
    /// Base64 of the digest; a composite one ends in `-N`, N the number of parts.
    pub value: String,
    /// Of the parts' checksums rather than of the bytes.
    pub composite: bool,
}

impl Sum {
    pub fn whole(algo: Algo, value: String) -> Self {
        Sum { algo, value, composite: false }
    }

    pub fn type_name(&self) -> &'static str {
        if self.composite { "COMPOSITE" } else { "FULL_OBJECT" }
    }

    /// As kept in the entry's attributes: `ALGO:TYPE:value`.
    pub fn to_attr(&self) -> String {
        format!("{}:{}:{}", self.algo.name(), self.type_name(), self.value)
    }

    pub fn from_attr(s: &str) -> Option<Sum> {
        let mut it = s.splitn(3, ':');
        let algo = Algo::parse(it.next()?)?;
        let composite = match it.next()? {
            "COMPOSITE" => true,
            "FULL_OBJECT" => false,
            _ => return None,
        };
        Some(Sum { algo, composite, value: it.next()?.to_string() })
    }
}

/// Where a request's checksum value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// In its `x-amz-checksum-*` header, known before the body.
    Header(String),
    /// In the aws-chunked body's trailer that `x-amz-trailer` announced: known after it.
    Trailer,
    /// Nowhere: the request named only the algorithm, for the gateway to compute.
    Nothing,
}

/// What a PutObject or UploadPart request says about its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub algo: Algo,
    pub given: Given,
}

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg.into())
}

fn bad_digest(a: Algo) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::BadDigest,
        format!("The {} you specified did not match the calculated checksum.", a.name()),
    )
}

/// Reads the checksum a request carries or asks for: at most one `x-amz-checksum-*` header or
/// trailer, agreeing with `x-amz-sdk-checksum-algorithm` when both are sent. A header value
/// that is not a digest of its algorithm cannot match any body: BadDigest before the body is
/// read.
pub fn asked(headers: &HeaderMap) -> S3Result<Option<Asked>> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().map(str::trim));
    let mut found = Vec::new();
    for a in ALL {
        match text(a.header()) {
            Some(Ok(v)) => found.push((a, Given::Header(v.to_string()))),
            Some(Err(_)) => return Err(bad_digest(a)),
            None => {}
        }
    }
    if let Some(Ok(t)) = text("x-amz-trailer") {
        for name in t.split(',').map(str::trim) {
            if let Some(a) = ALL.into_iter().find(|a| a.header().eq_ignore_ascii_case(name)) {
                found.push((a, Given::Trailer));
            }
        }
    }
    if found.len() > 1 {
        return Err(invalid("Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."));
    }
    let named = match text("x-amz-sdk-checksum-algorithm") {
        None => None,
        Some(v) => Some(v.ok().and_then(Algo::parse).ok_or_else(|| {
            invalid(
                "Value for x-amz-sdk-checksum-algorithm header is invalid: CRC32, CRC32C, CRC64NVME, SHA1 or SHA256",
            )
        })?),
    };
    let asked = match (found.pop(), named) {
        (Some((a, _)), Some(n)) if a != n => {
            return Err(invalid(format!(
                "x-amz-sdk-checksum-algorithm says {} but the request carries {}",
                n.name(),
                a.header()
            )));
        }
        (Some((algo, given)), _) => Asked { algo, given },
        (None, Some(algo)) => Asked { algo, given: Given::Nothing },
        (None, None) => return Ok(None),
    };
    if let Given::Header(v) = &asked.given
        && asked.algo.decode(v).is_none()
    {
        return Err(bad_digest(asked.algo));
    }
    Ok(Some(asked))
}

/// The checksum sent as a value without a header (a POST form's field): at most one, a digest.
pub fn from_fields(mut fields: Vec<(Algo, String)>) -> S3Result<Option<Asked>> {
    if fields.len() > 1 {
        return Err(invalid("Expecting a single x-amz-checksum- field. Multiple checksum Types are not allowed."));
    }
    let Some((algo, v)) = fields.pop() else { return Ok(None) };
    if algo.decode(&v).is_none() {
        return Err(bad_digest(algo));
    }
    Ok(Some(Asked { algo, given: Given::Header(v) }))
}

/// The checksums a body's stream computes, read once the write returned.
#[derive(Clone, Default)]
pub struct Computed(Arc<Mutex<Vec<(Algo, String)>>>);

impl Computed {
    pub fn get(&self, a: Algo) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(x, _)| *x == a).map(|(_, v)| v.clone())
    }
}

/// The checking of one body: the algorithms to compute (the request's, and the upload's for a
/// part) and the value to compare with at the end.
pub struct Check {
    running: Vec<(Algo, Running)>,
    expect: Option<Asked>,
    trailers: Option<TrailingHeaders>,
    out: Computed,
}

impl Check {
    /// A check of `asked` (with the trailer handle, for a value in a trailer), also computing
    /// `also`; `None` when there is nothing to compute.
    pub fn new(
        asked: Option<&Asked>,
        also: Option<Algo>,
        trailers: Option<TrailingHeaders>,
    ) -> (Option<Check>, Computed) {
        let out = Computed::default();
        let mut algos: Vec<Algo> = asked.map(|a| a.algo).into_iter().chain(also).collect();
        algos.dedup();
        if algos.is_empty() {
            return (None, out);
        }
        let running = algos.into_iter().map(|a| (a, Running::new(a))).collect();
        (Some(Check { running, expect: asked.cloned(), trailers, out: out.clone() }), out)
    }

    pub fn update(&mut self, d: &[u8]) {
        for (_, r) in &mut self.running {
            r.update(d);
        }
    }

    /// At the body's end: the digests, and the error that must fail the write if the one the
    /// request gave does not match (or its announced trailer never came).
    pub fn finish(&mut self) -> Result<(), S3Error> {
        let mut done = Vec::new();
        for (a, r) in std::mem::take(&mut self.running) {
            done.push((a, B64.encode(r.finish())));
        }
        *self.out.0.lock().unwrap_or_else(|p| p.into_inner()) = done;
        let Some(asked) = &self.expect else { return Ok(()) };
        let want = match &asked.given {
            Given::Nothing => return Ok(()),
            Given::Header(v) => v.clone(),
            Given::Trailer => {
                let name = asked.algo.header();
                let got = self.trailers.as_ref().and_then(|t| t.read(|h| h.get(name).map(|v| v.as_bytes().to_vec())));
                match got.flatten() {
                    Some(v) => String::from_utf8_lossy(&v).trim().to_string(),
                    None => {
                        return Err(invalid(format!(
                            "x-amz-trailer announced {name}, but the body ended without that trailer; nothing was stored"
                        )));
                    }
                }
            }
        };
        match self.out.get(asked.algo) {
            Some(got) if got == want => Ok(()),
            _ => Err(bad_digest(asked.algo)),
        }
    }
}

/// The checksum of an object made of parts whose checksums (`parts`, base64, in order) and
/// sizes are those given: the CRCs combined for `FULL_OBJECT`, the digest of the digests with
/// `-N` for `COMPOSITE`. `None` if a part's checksum is missing or not a digest.
pub fn of_parts(algo: Algo, full_object: bool, parts: &[(Option<String>, u64)]) -> Option<Sum> {
    let digests: Vec<Vec<u8>> =
        parts.iter().map(|(v, _)| v.as_deref().and_then(|v| algo.decode(v))).collect::<Option<_>>()?;
    if full_object {
        let which = match algo {
            Algo::Crc32 => crc_fast::CrcAlgorithm::Crc32IsoHdlc,
            Algo::Crc32c => crc_fast::CrcAlgorithm::Crc32Iscsi,
            Algo::Crc64Nvme => crc_fast::CrcAlgorithm::Crc64Nvme,
            Algo::Sha1 | Algo::Sha256 => return None,
        };
        let as_u64 = |d: &[u8]| d.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let mut crc: Option<u64> = None;
        for (d, (_, len)) in digests.iter().zip(parts) {
            let c = as_u64(d);
            crc = Some(match crc {
                None => c,
                Some(acc) => crc_fast::checksum_combine(which, acc, c, *len),
            });
        }
        let c = crc.unwrap_or_else(|| as_u64(&algo.digest(b"")));
        let bytes = c.to_be_bytes();
        let value = B64.encode(&bytes[8 - algo.digest_len()..]);
        return Some(Sum { algo, value, composite: false });
    }
    let joined: Vec<u8> = digests.concat();
    Some(Sum { algo, value: format!("{}-{}", B64.encode(algo.digest(&joined)), parts.len()), composite: true })
}

/// Whether the checksum a client sent with CompleteMultipartUpload is the object's: a composite
/// one may come with or without its `-N`.
pub fn matches(sent: &str, made: &Sum) -> bool {
    let sent = sent.trim();
    sent == made.value || (made.composite && made.value.rsplit_once('-').is_some_and(|(v, _)| v == sent))
}

/// Sets an S3 output's checksum fields from `$sum` (an `Option<&Sum>`): the algorithm's, and
/// with `typed` the checksum type too.
macro_rules! with_checksum {
    ($out:expr, $sum:expr) => {{
        if let Some(s) = $sum {
            let s: &$crate::checksum::Sum = s;
            let v = Some(s.value.clone());
            match s.algo {
                $crate::checksum::Algo::Crc32 => $out.checksum_crc32 = v,
                $crate::checksum::Algo::Crc32c => $out.checksum_crc32c = v,
                $crate::checksum::Algo::Crc64Nvme => $out.checksum_crc64nvme = v,
                $crate::checksum::Algo::Sha1 => $out.checksum_sha1 = v,
                $crate::checksum::Algo::Sha256 => $out.checksum_sha256 = v,
            }
        }
    }};
    ($out:expr, $sum:expr, typed) => {{
        if let Some(s) = $sum {
            let s: &$crate::checksum::Sum = s;
            with_checksum!($out, Some(s));
            $out.checksum_type = Some(s3s::dto::ChecksumType::from(s.type_name().to_string()));
        }
    }};
}
pub(crate) use with_checksum;

/// The checksum a part listed in CompleteMultipartUpload (or a ListParts answer) carries.
macro_rules! sent_checksum {
    ($part:expr, $algo:expr) => {{
        let p = &$part;
        match $algo {
            $crate::checksum::Algo::Crc32 => p.checksum_crc32.clone(),
            $crate::checksum::Algo::Crc32c => p.checksum_crc32c.clone(),
            $crate::checksum::Algo::Crc64Nvme => p.checksum_crc64nvme.clone(),
            $crate::checksum::Algo::Sha1 => p.checksum_sha1.clone(),
            $crate::checksum::Algo::Sha256 => p.checksum_sha256.clone(),
        }
    }};
}
pub(crate) use sent_checksum;

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        m
    }

    /// The values ceph/s3-tests knows for 1,024 and 3 × 5 MiB of 'A', 'B', 'C'.
    #[test]
    fn digests_and_combinations_are_s3s() {
        let a1k = vec![b'A'; 1024];
        assert_eq!(B64.encode(Algo::Sha256.digest(&a1k)), "arcu6553sHVAiX4MjW0j7I7vD4w6R+Gz9Ok0Q9lTa+0=");
        assert_eq!(B64.encode(Algo::Crc64Nvme.digest(&a1k)), "Qeh8oXvGiSo=");
        let mib5 = 5 * 1024 * 1024;
        let parts: Vec<Vec<u8>> = [b'A', b'B', b'C'].iter().map(|c| vec![*c; mib5]).collect();
        for (algo, full, want) in [
            (Algo::Crc32, true, "WgDhBQ=="),
            (Algo::Crc32c, true, "xU+Krw=="),
            (Algo::Crc64Nvme, true, "i+6LR0y3eFo="),
            (Algo::Sha256, false, "uWBwpe1dxI4Vw8Gf0X9ynOdw/SS6VBzfWm9giiv1sf4=-3"),
            (Algo::Sha1, false, "sizjvY4eud3MrcHdZM3cQ/ol39o=-3"),
        ] {
            let sums: Vec<(Option<String>, u64)> =
                parts.iter().map(|p| (Some(B64.encode(algo.digest(p))), p.len() as u64)).collect();
            let made = of_parts(algo, full, &sums).unwrap();
            assert_eq!(made.value, want, "{algo:?}");
            if full {
                // Combined equals computed over the whole.
                assert_eq!(B64.encode(algo.digest(&parts.concat())), want);
            }
        }
        assert_eq!(of_parts(Algo::Crc32, true, &[(None, 1)]), None);
    }

    #[test]
    fn a_request_carries_one_checksum_and_agrees_with_its_algorithm() {
        let v = B64.encode(Algo::Crc32.digest(b"x"));
        assert_eq!(
            asked(&h(&[("x-amz-checksum-crc32", &v)])).unwrap(),
            Some(Asked { algo: Algo::Crc32, given: Given::Header(v.clone()) })
        );
        assert_eq!(
            asked(&h(&[("x-amz-trailer", "x-amz-checksum-crc32c"), ("x-amz-sdk-checksum-algorithm", "crc32c")]))
                .unwrap(),
            Some(Asked { algo: Algo::Crc32c, given: Given::Trailer })
        );
        assert_eq!(
            asked(&h(&[("x-amz-sdk-checksum-algorithm", "SHA1")])).unwrap(),
            Some(Asked { algo: Algo::Sha1, given: Given::Nothing })
        );
        assert_eq!(asked(&HeaderMap::new()).unwrap(), None);
        let code = |m: HeaderMap| asked(&m).unwrap_err().code().clone();
        assert_eq!(code(h(&[("x-amz-checksum-sha256", "bad")])), S3ErrorCode::BadDigest);
        assert_eq!(code(h(&[("x-amz-checksum-crc32", &v), ("x-amz-checksum-sha1", "x")])), S3ErrorCode::InvalidRequest);
        assert_eq!(
            code(h(&[("x-amz-checksum-crc32", &v), ("x-amz-sdk-checksum-algorithm", "SHA256")])),
            S3ErrorCode::InvalidRequest
        );
        assert_eq!(code(h(&[("x-amz-sdk-checksum-algorithm", "MD4")])), S3ErrorCode::InvalidRequest);
    }

    #[test]
    fn a_check_fails_a_body_that_does_not_match() {
        let good = B64.encode(Algo::Sha256.digest(b"hello"));
        let run = |given: Given| {
            let asked = Asked { algo: Algo::Sha256, given };
            let (c, out) = Check::new(Some(&asked), Some(Algo::Crc32), None);
            let mut c = c.unwrap();
            c.update(b"hel");
            c.update(b"lo");
            (c.finish().map_err(|e| e.code().clone()), out)
        };
        let (r, out) = run(Given::Header(good.clone()));
        assert_eq!(r, Ok(()));
        assert_eq!(out.get(Algo::Sha256), Some(good));
        assert_eq!(out.get(Algo::Crc32), Some(B64.encode(Algo::Crc32.digest(b"hello"))));
        let other = B64.encode(Algo::Sha256.digest(b"hellO"));
        assert_eq!(run(Given::Header(other)).0, Err(S3ErrorCode::BadDigest));
        // A trailer announced and never sent.
        assert_eq!(run(Given::Trailer).0, Err(S3ErrorCode::InvalidRequest));
        assert!(Sum::from_attr(&Sum::whole(Algo::Crc32, "abc=".into()).to_attr()).is_some_and(|s| !s.composite));
        let comp = Sum { algo: Algo::Sha1, value: "xyz=-3".into(), composite: true };
        assert!(matches("xyz=", &comp) && matches("xyz=-3", &comp) && !matches("xyz=-2", &comp));
    }
}
