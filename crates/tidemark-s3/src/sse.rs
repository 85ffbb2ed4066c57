//! Server-side encryption at rest: what a request asks for (SSE-S3, SSE-KMS, SSE-C), the
//! object's sealed data key, and the cipher its bytes are stored under. Pure logic: no I/O but
//! [`Keyring::load`].
//!
//! Every encrypted object has its own random 256-bit data key, stored sealed (AES-256-GCM) in
//! the object's attribute [`ATTR_SSE`] under a key-encryption key: the keyring's `aws/s3` key
//! (SSE-S3), the keyring key the request names (SSE-KMS), or the client's own key (SSE-C, which
//! the gateway never stores: without it the data key cannot be unsealed, and a wrong key fails
//! the seal's check). The bytes are AES-256-CTR under the data key with a random IV per
//! upload (one per part of a multipart object): the stored bytes are as long as the object, so
//! sizes, ranges and parts need no translation, and any range decrypts on its own.
//!
//! CTR gives confidentiality, not authentication of the stored bytes, as for an unencrypted
//! object (RGW's SSE, AES-CBC, is the same): a flipped bit at rest flips a bit of what is read.
//! A checksum stored with the object (x-amz-checksum-*) is of the plaintext and still checks it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aes::cipher::{KeyIvInit, StreamCipher, StreamCipherSeek};
use aes_gcm::aead::{Aead, KeyInit, Payload};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

/// The attribute holding an encrypted object's [`Sealed`] data key and IVs (JSON).
pub const ATTR_SSE: &str = tidemark_core::model::object_attrs::SSE;

/// `x-amz-server-side-encryption` of SSE-S3, and SSE-C's only algorithm.
pub const AES256: &str = "AES256";
/// `x-amz-server-side-encryption` of SSE-KMS.
pub const KMS: &str = "aws:kms";
/// The mode recorded for an object encrypted with its client's key.
const CUSTOMER: &str = "SSE-C";
/// The keyring key SSE-S3 seals data keys with (AWS's name for the S3-managed key).
pub const S3_KEY: &str = "aws/s3";

type Key = [u8; 32];
type Ctr = ctr::Ctr128BE<aes::Aes256>;

/// Named 256-bit keys, from a file of `NAME=BASE64` lines (`openssl rand -base64 32` makes a
/// key): `aws/s3` for SSE-S3, any name for SSE-KMS. The gateway's "KMS" is this file: keep it
/// where the content is not (a secrets manager's tmpfs, not the data directory).
#[derive(Clone, Default)]
pub struct Keyring {
    keys: BTreeMap<String, Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a key never reaches a log.
        f.debug_struct("Keyring").field("keys", &self.keys.keys().collect::<Vec<_>>()).finish()
    }
}

impl Keyring {
    pub fn parse(text: &str) -> Result<Keyring, String> {
        let mut keys = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |what: &str| format!("line {}: {what}", n + 1);
            let (name, key) = line.split_once('=').ok_or_else(|| at("not NAME=BASE64"))?;
            let (name, key) = (name.trim(), key.trim());
            if name.is_empty()
                || name.len() > 256
                || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_.:-".contains(&b))
            {
                return Err(at(&format!("key name {name:?}: letters, digits and / _ . : - (at most 256)")));
            }
            let raw = B64.decode(key).map_err(|_| at(&format!("the key of {name} is not base64")))?;
            let k: Key = raw.try_into().map_err(|_| {
                at(&format!("the key of {name} is not 32 bytes (make one with `openssl rand -base64 32`)"))
            })?;
            if keys.insert(name.to_string(), k).is_some() {
                return Err(at(&format!("key {name} is named twice")));
            }
        }
        Ok(Keyring { keys })
    }

    /// Reads a keyring file, refusing one that others than its owner may read.
    pub fn load(path: &std::path::Path) -> Result<Keyring, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the keyring {shown}: {e}"))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(format!("the keyring {shown} can be read by others than its owner: chmod 600 {shown}"));
            }
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the keyring {shown}: {e}"))?;
        Keyring::parse(&text).map_err(|e| format!("the keyring {shown}, {e}"))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    pub fn has(&self, name: &str) -> bool {
        self.keys.contains_key(name)
    }
}

/// The client's own key (SSE-C), checked against the MD5 it was sent with.
#[derive(Clone)]
pub struct CustomerKey {
    key: Key,
    /// Base64 of the key's MD5: what S3 answers in `...-customer-key-md5`.
    pub md5: String,
}

/// What a write asks for.
#[derive(Clone)]
pub enum Want {
    S3,
    /// A keyring key's name.
    Kms(String),
    Customer(CustomerKey),
}

/// Why a request's encryption cannot be honoured, each its own S3 error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Headers that contradict each other or are malformed: 400 InvalidArgument.
    Invalid(String),
    /// SSE-S3 or SSE-KMS with no keyring configured: 501 NotImplemented.
    NoKeyring,
    /// SSE-KMS naming a key the keyring lacks: 400 KMS.NotFoundException.
    NoSuchKey(String),
    /// An SSE-C object read without its key: 400 InvalidRequest.
    NeedsCustomerKey,
    /// SSE-C headers on an object not encrypted with a customer key: 400 InvalidRequest.
    NotCustomer,
    /// The customer key given is not the object's: 400 (as RGW; AWS answers 403).
    WrongCustomerKey,
    /// The key that sealed an object is gone from the keyring, or its seal does not open: 500.
    Unreadable(String),
}

/// The encryption headers of a request, as given.
#[derive(Default, Clone, Copy)]
pub struct Headers<'a> {
    pub sse: Option<&'a str>,
    pub kms_key_id: Option<&'a str>,
    pub customer_algorithm: Option<&'a str>,
    pub customer_key: Option<&'a str>,
    pub customer_key_md5: Option<&'a str>,
}

/// What a write's headers ask for (none: nothing), or why they make no sense.
pub fn asked(h: Headers<'_>) -> Result<Option<Want>, Refusal> {
    let customer = customer_key(h.customer_algorithm, h.customer_key, h.customer_key_md5)?;
    let invalid = |m: String| Err(Refusal::Invalid(m));
    match (h.sse, customer) {
        (Some(_), Some(_)) => invalid(
            "x-amz-server-side-encryption and a customer key (SSE-C) together: an object is encrypted one way".into(),
        ),
        (None, Some(c)) if h.kms_key_id.is_none() => Ok(Some(Want::Customer(c))),
        (None, _) if h.kms_key_id.is_some() => {
            invalid("x-amz-server-side-encryption-aws-kms-key-id needs x-amz-server-side-encryption: aws:kms".into())
        }
        (None, _) => Ok(None),
        (Some(AES256), None) if h.kms_key_id.is_none() => Ok(Some(Want::S3)),
        (Some(AES256), None) => invalid("a KMS key id with x-amz-server-side-encryption: AES256".into()),
        (Some(KMS), None) => match h.kms_key_id.filter(|k| !k.is_empty()) {
            Some(k) => Ok(Some(Want::Kms(k.to_string()))),
            // No key of its own: which keyring key to use is the request's to say.
            None => invalid(
                "x-amz-server-side-encryption: aws:kms needs x-amz-server-side-encryption-aws-kms-key-id".into(),
            ),
        },
        (Some(other), None) => invalid(format!("x-amz-server-side-encryption: {other:?}: AES256 or aws:kms")),
    }
}

/// A customer key from its three headers (`...-customer-algorithm`, `-key`, `-key-md5`, or
/// their `copy-source` forms): all or none.
pub fn customer_key(
    algorithm: Option<&str>,
    key: Option<&str>,
    md5: Option<&str>,
) -> Result<Option<CustomerKey>, Refusal> {
    let invalid = |m: &str| Err(Refusal::Invalid(m.to_string()));
    let (algorithm, key) = match (algorithm, key) {
        (None, None) if md5.is_none() => return Ok(None),
        (None, _) => {
            return invalid(
                "a customer key needs its algorithm (x-amz-server-side-encryption-customer-algorithm: AES256)",
            );
        }
        (Some(_), None) => {
            return invalid("the customer algorithm needs its key (x-amz-server-side-encryption-customer-key)");
        }
        (Some(a), Some(k)) => (a, k),
    };
    if algorithm != AES256 {
        return invalid("the customer algorithm must be AES256");
    }
    let raw = B64.decode(key.trim()).map_err(|_| Refusal::Invalid("the customer key is not base64".into()))?;
    let key: Key = raw.try_into().map_err(|_| Refusal::Invalid("the customer key must be 256 bits".into()))?;
    let made = {
        use md5::{Digest, Md5};
        B64.encode(Md5::digest(key))
    };
    match md5 {
        None => invalid("the customer key needs its MD5 (x-amz-server-side-encryption-customer-key-md5)"),
        Some(m) if m.trim() != made => invalid("the customer key's MD5 is not the MD5 of the key given"),
        Some(_) => Ok(Some(CustomerKey { key, md5: made })),
    }
}

/// An object's data key, sealed, and the IVs its bytes were encrypted with (one per part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// `AES256`, `aws:kms` or `SSE-C`.
    pub mode: String,
    /// The keyring key that sealed it (SSE-S3 and SSE-KMS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Base64 of the seal's nonce and the sealed data key.
    pub wrapped: String,
    /// Base64 IVs, in the order of the object's parts.
    #[serde(default)]
    pub ivs: Vec<String>,
}

/// A data key: what encrypts and decrypts an object's bytes.
#[derive(Clone)]
pub struct DataKey(Key);

fn aad(mode: &str, key_id: Option<&str>) -> Vec<u8> {
    // Binds the seal to how it was made: an SSE-S3 seal cannot be passed off as a KMS key's.
    format!("tidemark-sse-v1\0{mode}\0{}", key_id.unwrap_or("")).into_bytes()
}

fn random<const N: usize>() -> Result<[u8; N], Refusal> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| Refusal::Unreadable(format!("no randomness for a key: {e}")))?;
    Ok(b)
}

impl Sealed {
    /// The sealed data key of the object `ext` describes, if it is encrypted.
    pub fn of(ext: &BTreeMap<String, String>) -> Result<Option<Sealed>, Refusal> {
        match ext.get(ATTR_SSE) {
            None => Ok(None),
            Some(v) => serde_json::from_str(v)
                .map(Some)
                .map_err(|e| Refusal::Unreadable(format!("its encryption record is damaged: {e}"))),
        }
    }

    pub fn to_attr(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn is_customer(&self) -> bool {
        self.mode == CUSTOMER
    }

    /// A new data key for an object written as `want` asks, sealed, with no IVs yet.
    pub fn new(want: &Want, keyring: Option<&Keyring>) -> Result<(Sealed, DataKey), Refusal> {
        let (mode, key_id, kek) = kek_for(want, keyring)?;
        let dk: Key = random()?;
        let nonce: [u8; 12] = random()?;
        let cipher = aes_gcm::Aes256Gcm::new((&kek).into());
        let aad = aad(mode, key_id.as_deref());
        let sealed = cipher
            .encrypt((&nonce).into(), Payload { msg: &dk, aad: &aad })
            .map_err(|_| Refusal::Unreadable("sealing a data key failed".into()))?;
        let mut wrapped = nonce.to_vec();
        wrapped.extend_from_slice(&sealed);
        Ok((Sealed { mode: mode.to_string(), key_id, wrapped: B64.encode(wrapped), ivs: Vec::new() }, DataKey(dk)))
    }

    /// The data key, unsealed with the customer's key or the keyring's.
    pub fn open(&self, customer: Option<&CustomerKey>, keyring: Option<&Keyring>) -> Result<DataKey, Refusal> {
        let kek: Key = match (self.is_customer(), customer) {
            (true, None) => return Err(Refusal::NeedsCustomerKey),
            (false, Some(_)) => return Err(Refusal::NotCustomer),
            (true, Some(c)) => c.key,
            (false, None) => {
                let id = self.key_id.as_deref().unwrap_or(S3_KEY);
                let ring = keyring.ok_or_else(|| {
                    Refusal::Unreadable(format!(
                        "it is encrypted under keyring key {id:?}, and this gateway has no keyring (--sse-keys)"
                    ))
                })?;
                *ring.keys.get(id).ok_or_else(|| {
                    Refusal::Unreadable(format!(
                        "it is encrypted under keyring key {id:?}, which this gateway's keyring lacks"
                    ))
                })?
            }
        };
        let raw = B64.decode(&self.wrapped).map_err(|_| Refusal::Unreadable("its sealed key is damaged".into()))?;
        if raw.len() != 12 + 48 {
            return Err(Refusal::Unreadable("its sealed key is damaged".into()));
        }
        let cipher = aes_gcm::Aes256Gcm::new((&kek).into());
        let aad = aad(&self.mode, self.key_id.as_deref());
        match cipher.decrypt(raw[..12].into(), Payload { msg: &raw[12..], aad: &aad }) {
            Ok(dk) => Ok(DataKey(dk.try_into().map_err(|_| Refusal::Unreadable("its sealed key is damaged".into()))?)),
            Err(_) if self.is_customer() => Err(Refusal::WrongCustomerKey),
            Err(_) => Err(Refusal::Unreadable("its sealed key does not open with the keyring's key".into())),
        }
    }

    /// What a response says of it: `x-amz-server-side-encryption`, the KMS key id, and for
    /// SSE-C the algorithm (the key's MD5 is the request's).
    pub fn shown(&self) -> (Option<&'static str>, Option<String>, Option<&'static str>) {
        match self.mode.as_str() {
            AES256 => (Some(AES256), None, None),
            KMS => (Some(KMS), self.key_id.clone(), None),
            _ => (None, None, Some(AES256)),
        }
    }
}

fn kek_for(want: &Want, keyring: Option<&Keyring>) -> Result<(&'static str, Option<String>, Key), Refusal> {
    let named = |id: &str| -> Result<Key, Refusal> {
        let ring = keyring.ok_or(Refusal::NoKeyring)?;
        ring.keys.get(id).copied().ok_or_else(|| Refusal::NoSuchKey(id.to_string()))
    };
    Ok(match want {
        Want::Customer(c) => (CUSTOMER, None, c.key),
        Want::S3 => (AES256, Some(S3_KEY.to_string()), named(S3_KEY)?),
        Want::Kms(id) => (KMS, Some(id.clone()), named(id)?),
    })
}

/// A new random IV, base64, for one upload (a whole object or one part).
pub fn new_iv() -> Result<String, Refusal> {
    Ok(B64.encode(random::<16>()?))
}

/// The keystream of an object: its data key and, for each part, where the part begins and the
/// IV it was encrypted with. Encrypting and decrypting are the same XOR.
#[derive(Clone)]
pub struct Cipher {
    key: Key,
    segments: Vec<(u64, [u8; 16])>,
}

impl Cipher {
    /// The cipher of bytes written in one go with `iv`.
    pub fn single(key: &DataKey, iv: &str) -> Result<Cipher, Refusal> {
        Cipher::of_parts(key, &[iv.to_string()], &[u64::MAX])
    }

    /// The cipher of an object of parts of `sizes` bytes, encrypted with `ivs` in order.
    pub fn of_parts(key: &DataKey, ivs: &[String], sizes: &[u64]) -> Result<Cipher, Refusal> {
        if ivs.len() != sizes.len() {
            return Err(Refusal::Unreadable(format!(
                "its encryption record has {} IVs for {} parts",
                ivs.len(),
                sizes.len()
            )));
        }
        let mut segments = Vec::with_capacity(ivs.len());
        let mut start = 0u64;
        for (iv, size) in ivs.iter().zip(sizes) {
            let raw = B64.decode(iv).ok().and_then(|r| <[u8; 16]>::try_from(r).ok());
            let iv = raw.ok_or_else(|| Refusal::Unreadable("an IV of its encryption record is damaged".into()))?;
            segments.push((start, iv));
            start = start.saturating_add(*size);
        }
        Ok(Cipher { key: key.0, segments })
    }

    /// XORs `buf`, the bytes at `offset` of the object, with their keystream.
    pub fn apply(&self, offset: u64, buf: &mut [u8]) {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let i = self.segments.partition_point(|(s, _)| *s <= at).saturating_sub(1);
            let (start, iv) = self.segments[i];
            let end = self.segments.get(i + 1).map_or(u64::MAX, |(s, _)| *s);
            let n = ((end - at).min((buf.len() - done) as u64)) as usize;
            let mut c = Ctr::new((&self.key).into(), (&iv).into());
            c.seek(at - start);
            c.apply_keystream(&mut buf[done..done + n]);
            done += n;
        }
    }
}

/// The MD5 of the plaintext a stream carried, known once it ended: what an encrypted object's
/// ETag is made of.
#[derive(Clone, Default)]
pub struct PlainMd5(Arc<Mutex<Option<md5::Md5>>>);

impl PlainMd5 {
    fn digest(&self) -> Option<[u8; 16]> {
        use md5::Digest;
        Some(self.0.lock().ok()?.take()?.finalize().into())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The ETag of encrypted bytes whose plaintext `md5` was taken: for SSE-S3 the plaintext's MD5,
/// as S3's (clients check it against what they sent); for SSE-KMS and SSE-C, whose ETags S3
/// says are not the MD5, a MAC of it under the data key — the same for the same bytes under
/// the same key (a part sent twice has one ETag), and telling nothing of the plaintext to one
/// without the key. `None` if the stream did not end.
pub fn etag(sealed: &Sealed, key: &DataKey, md5: &PlainMd5) -> Option<String> {
    use hmac::Mac;
    let d = md5.digest()?;
    if sealed.mode == AES256 {
        return Some(hex(&d));
    }
    let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&key.0).ok()?;
    mac.update(b"tidemark-sse-etag-v1\0");
    mac.update(&d);
    Some(hex(&mac.finalize().into_bytes()[..16]))
}

/// `stream`, the bytes of an object from `offset` on, encrypted or decrypted; with `md5`, the
/// MD5 of what went in is kept.
pub fn crypt(
    stream: tidemark_core::ByteStream,
    cipher: Cipher,
    offset: u64,
    md5: Option<PlainMd5>,
) -> tidemark_core::ByteStream {
    use md5::Digest;
    if let Some(m) = &md5
        && let Ok(mut g) = m.0.lock()
    {
        *g = Some(md5::Md5::new());
    }
    stream
        .scan(offset, move |at, chunk| {
            let out = chunk.map(|b| {
                if let Some(m) = &md5
                    && let Ok(mut g) = m.0.lock()
                    && let Some(h) = g.as_mut()
                {
                    h.update(&b);
                }
                // In place where the chunk is ours alone (a body's frames are), else a copy.
                let mut v = bytes::BytesMut::from(b);
                cipher.apply(*at, &mut v);
                *at += v.len() as u64;
                v.freeze()
            });
            futures::future::ready(Some(out))
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "pO3upElrwuEXSoFwCfnZPdSsmt/xWeFa0N9KgDijwVs=";
    const MD5_A: &str = "DWygnHRtgiJ77HCm+1rvHw==";
    const KEY_B: &str = "6b+WOZ1T3cqZMxgThRcXAQBrS5mXKdDUphvpxptl9/4=";
    const MD5_B: &str = "arxBvwY2V4SiOne6yppVPQ==";

    fn ring() -> Keyring {
        Keyring::parse(&format!("# test\naws/s3={KEY_A}\n\ntestkey-1 = {KEY_B}\n")).unwrap()
    }

    fn customer(k: &str, m: &str) -> Option<CustomerKey> {
        customer_key(Some(AES256), Some(k), Some(m)).unwrap()
    }

    #[test]
    fn keyrings_are_checked_line_by_line() {
        assert_eq!(ring().names().collect::<Vec<_>>(), ["aws/s3", "testkey-1"]);
        assert!(Keyring::parse("k").unwrap_err().contains("line 1"));
        assert!(Keyring::parse("k=AAAA").unwrap_err().contains("32 bytes"));
        assert!(Keyring::parse(&format!("a b={KEY_A}")).unwrap_err().contains("key name"));
        assert!(Keyring::parse(&format!("k={KEY_A}\nk={KEY_B}")).unwrap_err().contains("line 2"));
        assert!(!format!("{:?}", ring()).contains(KEY_A));
    }

    #[test]
    fn requests_ask_one_way_or_are_refused() {
        let h = |sse, kms, algo, key, md5| Headers {
            sse,
            kms_key_id: kms,
            customer_algorithm: algo,
            customer_key: key,
            customer_key_md5: md5,
        };
        assert!(asked(h(None, None, None, None, None)).unwrap().is_none());
        assert!(matches!(asked(h(Some("AES256"), None, None, None, None)), Ok(Some(Want::S3))));
        assert!(matches!(asked(h(Some("aws:kms"), Some("k"), None, None, None)), Ok(Some(Want::Kms(k))) if k == "k"));
        assert!(matches!(asked(h(None, None, Some("AES256"), Some(KEY_A), Some(MD5_A))), Ok(Some(Want::Customer(_)))));
        for bad in [
            h(Some("aes:kms"), None, None, None, None),
            h(Some("aws:kms"), None, None, None, None),
            h(None, Some("k"), None, None, None),
            h(Some("AES256"), Some("k"), None, None, None),
            h(Some("AES256"), None, Some("AES256"), Some(KEY_A), Some(MD5_A)),
            h(None, None, None, Some(KEY_A), Some(MD5_A)),
            h(None, None, Some("AES256"), Some(KEY_A), Some(MD5_B)),
            h(None, None, Some("AES256"), Some(KEY_A), None),
            h(None, None, Some("AES128"), Some(KEY_A), Some(MD5_A)),
            h(None, None, Some("AES256"), Some("AAAA"), Some(MD5_A)),
        ] {
            assert!(matches!(asked(bad), Err(Refusal::Invalid(_))));
        }
    }

    #[test]
    fn etags_of_kms_and_customer_objects_are_keyed_and_stable() {
        let (k, dk) = Sealed::new(&Want::Kms("testkey-1".into()), Some(&ring())).unwrap();
        let (_, other) = Sealed::new(&Want::Kms("testkey-1".into()), Some(&ring())).unwrap();
        let md5_of = |b: &[u8]| {
            use md5::Digest;
            let m = PlainMd5::default();
            *m.0.lock().unwrap() = Some(md5::Md5::new_with_prefix(b));
            m
        };
        let a = etag(&k, &dk, &md5_of(b"x")).unwrap();
        assert_eq!(a.len(), 32);
        assert_eq!(Some(a.clone()), etag(&k, &dk, &md5_of(b"x")));
        assert_ne!(Some(a.clone()), etag(&k, &dk, &md5_of(b"y")));
        assert_ne!(Some(a), etag(&k, &other, &md5_of(b"x")));
        assert_eq!(etag(&k, &dk, &PlainMd5::default()), None);
    }

    #[test]
    fn a_data_key_opens_only_with_what_sealed_it() {
        let r = ring();
        let (s, _) = Sealed::new(&Want::S3, Some(&r)).unwrap();
        assert_eq!(s.shown().0, Some(AES256));
        assert!(s.open(None, Some(&r)).is_ok());
        assert!(matches!(s.open(None, None), Err(Refusal::Unreadable(_))));
        assert_eq!(s.open(customer(KEY_A, MD5_A).as_ref(), Some(&r)).err(), Some(Refusal::NotCustomer));
        let (k, _) = Sealed::new(&Want::Kms("testkey-1".into()), Some(&r)).unwrap();
        assert_eq!(k.shown().1.as_deref(), Some("testkey-1"));
        // The seal is bound to its key id: relabelled, it does not open.
        let relabelled = Sealed { key_id: Some(S3_KEY.into()), ..k.clone() };
        assert!(matches!(relabelled.open(None, Some(&r)), Err(Refusal::Unreadable(_))));
        assert_eq!(Sealed::new(&Want::Kms("nope".into()), Some(&r)).err(), Some(Refusal::NoSuchKey("nope".into())));
        assert_eq!(Sealed::new(&Want::S3, None).err(), Some(Refusal::NoKeyring));
        let a = customer(KEY_A, MD5_A).unwrap();
        let (c, _) = Sealed::new(&Want::Customer(a.clone()), None).unwrap();
        assert!(c.open(Some(&a), None).is_ok());
        assert_eq!(c.open(customer(KEY_B, MD5_B).as_ref(), None).err(), Some(Refusal::WrongCustomerKey));
        assert_eq!(c.open(None, Some(&r)).err(), Some(Refusal::NeedsCustomerKey));
        let back = Sealed::of(&BTreeMap::from([(ATTR_SSE.to_string(), c.to_attr())])).unwrap().unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn any_range_of_any_part_decrypts_on_its_own() {
        let (_, dk) = Sealed::new(&Want::S3, Some(&ring())).unwrap();
        let plain: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let sizes = [4_000u64, 3_333, 2_667];
        let ivs: Vec<String> = (0..3).map(|_| new_iv().unwrap()).collect();
        // Each part encrypted alone, as uploaded.
        let mut stored = Vec::new();
        let mut at = 0usize;
        for (iv, size) in ivs.iter().zip(sizes) {
            let mut part = plain[at..at + size as usize].to_vec();
            Cipher::single(&dk, iv).unwrap().apply(0, &mut part);
            stored.extend(part);
            at += size as usize;
        }
        assert_ne!(stored, plain);
        let whole = Cipher::of_parts(&dk, &ivs, &sizes).unwrap();
        for (from, to) in [(0, 10_000), (3_990, 4_010), (17, 9_999), (7_333, 7_334), (5, 5)] {
            let mut got = stored[from..to].to_vec();
            whole.apply(from as u64, &mut got);
            assert_eq!(got, plain[from..to], "{from}..{to}");
        }
        assert!(Cipher::of_parts(&dk, &ivs[..2], &sizes).is_err());
    }

    #[tokio::test]
    async fn a_stream_is_encrypted_chunk_by_chunk_and_its_plaintext_hashed() {
        let (_, dk) = Sealed::new(&Want::S3, Some(&ring())).unwrap();
        let iv = new_iv().unwrap();
        let chunks: Vec<std::io::Result<bytes::Bytes>> =
            vec![Ok(bytes::Bytes::from_static(b"hello ")), Ok(bytes::Bytes::from_static(b"world"))];
        let md5 = PlainMd5::default();
        let enc = crypt(futures::stream::iter(chunks).boxed(), Cipher::single(&dk, &iv).unwrap(), 0, Some(md5.clone()));
        let out: Vec<u8> = enc.map(|c| c.unwrap().to_vec()).concat().await;
        let (s3, _) = Sealed::new(&Want::S3, Some(&ring())).unwrap();
        assert_eq!(etag(&s3, &dk, &md5.clone()).as_deref(), Some("5eb63bbbe01eeed093cb22bb8f5acdc3"));
        let back = crypt(
            futures::stream::iter(vec![Ok(bytes::Bytes::from(out[3..].to_vec()))]).boxed(),
            Cipher::single(&dk, &iv).unwrap(),
            3,
            None,
        );
        let got: Vec<u8> = back.map(|c| c.unwrap().to_vec()).concat().await;
        assert_eq!(got, b"lo world");
    }
}
