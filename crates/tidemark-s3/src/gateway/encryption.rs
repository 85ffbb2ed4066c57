//! The gateway's server-side encryption: which writes are encrypted and how, and the key a read
//! needs (see [`crate::sse`] for the keys and the cipher).

use super::*;
use crate::sse::{self, ATTR_SSE, Cipher, CustomerKey, DataKey, Headers, PlainMd5, Refusal, Sealed, Want};

/// A bucket's default encryption (`s3.encryption`, s3s's type as JSON).
pub const ATTR_ENCRYPTION: &str = "s3.encryption";

/// The S3 error of a refusal.
pub(super) fn refused(r: Refusal) -> S3Error {
    use hyper::StatusCode;
    match r {
        Refusal::Invalid(m) => S3Error::with_message(S3ErrorCode::InvalidArgument, m),
        Refusal::NoKeyring => S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "encryption with the gateway's keys (SSE-S3, SSE-KMS) needs a keyring, and this gateway has none: \
             start it with --sse-keys FILE (NAME=BASE64 lines; `aws/s3` is SSE-S3's key). SSE-C needs none",
        ),
        Refusal::NoSuchKey(k) => custom_error(
            "KMS.NotFoundException",
            StatusCode::BAD_REQUEST,
            format!("key {k:?} is not in this gateway's keyring"),
        ),
        Refusal::NeedsCustomerKey => S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "The object was stored using a form of Server Side Encryption. The correct parameters must be provided \
             to retrieve the object.",
        ),
        Refusal::NotCustomer => S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "The encryption parameters are not applicable to this object (it is not encrypted with a customer key).",
        ),
        // 400, as RGW answers and ceph/s3-tests expect; AWS answers 403.
        Refusal::WrongCustomerKey => S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "The customer key given is not the one the object was encrypted with.",
        ),
        Refusal::Unreadable(m) => {
            S3Error::with_message(S3ErrorCode::InternalError, format!("the object cannot be decrypted: {m}"))
        }
    }
}

/// Whether a request came over TLS or from this machine: where a customer's key may be sent.
pub(super) fn secure(ext: &hyper::http::Extensions) -> bool {
    ext.get::<tidemark_http::Peer>().is_some_and(|p| p.tls || p.addr.ip().is_loopback())
}

/// A customer key sent in the clear across a network is refused, as S3 refuses it over HTTP
/// (the key would be the object's only protection).
fn check_secure(secure: bool, key: &Option<CustomerKey>) -> S3Result<()> {
    if key.is_some() && !secure {
        return Err(s3_error!(
            InvalidRequest,
            "Requests specifying Server Side Encryption with Customer provided keys must be made over a secure connection."
        ));
    }
    Ok(())
}

/// The customer key of `...-customer-*` headers (or their copy-source forms), if sent.
pub(super) fn customer(
    secure: bool,
    algo: Option<&str>,
    key: Option<&str>,
    md5: Option<&str>,
) -> S3Result<Option<CustomerKey>> {
    let key = sse::customer_key(algo, key, md5).map_err(refused)?;
    check_secure(secure, &key)?;
    Ok(key)
}

/// `x-amz-server-side-encryption` (or its KMS key id) on a GET or HEAD: S3 refuses it, an
/// object's encryption being its own.
pub(super) fn refuse_on_read(headers: &hyper::HeaderMap) -> S3Result<()> {
    for h in ["x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id"] {
        if headers.contains_key(h) {
            return Err(s3_error!(InvalidArgument, "{h} is for writes: a read decrypts as the object was encrypted"));
        }
    }
    Ok(())
}

/// What a response shows of an object's encryption.
#[derive(Default, Clone)]
pub(super) struct Shown {
    pub sse: Option<ServerSideEncryption>,
    pub kms_key_id: Option<String>,
    pub customer_algorithm: Option<String>,
    pub customer_key_md5: Option<String>,
}

impl Shown {
    pub fn of(sealed: &Sealed, customer: Option<&CustomerKey>) -> Shown {
        let (sse, kms, algo) = sealed.shown();
        Shown {
            sse: sse.map(ServerSideEncryption::from_static),
            kms_key_id: kms,
            customer_algorithm: algo.map(str::to_string),
            customer_key_md5: algo.and(customer.map(|c| c.md5.clone())),
        }
    }
}

/// Sets an output's encryption headers from a [`Shown`].
macro_rules! with_sse {
    ($out:expr, $shown:expr) => {{
        let s: Option<crate::gateway::encryption::Shown> = $shown;
        if let Some(s) = s {
            $out.server_side_encryption = s.sse;
            $out.ssekms_key_id = s.kms_key_id;
            $out.sse_customer_algorithm = s.customer_algorithm;
            $out.sse_customer_key_md5 = s.customer_key_md5;
        }
    }};
}
pub(super) use with_sse;

/// A write being encrypted: its sealed data key (with the IVs of what was written) and the key.
pub(super) struct Encrypting {
    pub sealed: Sealed,
    key: DataKey,
    customer: Option<CustomerKey>,
    /// Of the plaintext: the ETag is made of it ([`sse::etag`]).
    plain_md5: PlainMd5,
}

impl Encrypting {
    /// `stream` encrypted under a new IV, recorded in the sealed key.
    pub fn encrypt(&mut self, stream: tidemark_core::ByteStream) -> S3Result<tidemark_core::ByteStream> {
        let iv = sse::new_iv().map_err(refused)?;
        let cipher = Cipher::single(&self.key, &iv).map_err(refused)?;
        self.sealed.ivs = vec![iv];
        Ok(sse::crypt(stream, cipher, 0, Some(self.plain_md5.clone())))
    }

    pub fn shown(&self) -> Shown {
        Shown::of(&self.sealed, self.customer.as_ref())
    }

    /// The ETag of what was written (not the MD5 of the stored bytes).
    pub fn plain_etag(&self) -> Option<String> {
        sse::etag(&self.sealed, &self.key, &self.plain_md5)
    }
}

/// A read being decrypted.
pub(super) struct Decrypting {
    cipher: Cipher,
    pub shown: Shown,
}

impl Decrypting {
    /// `stream`, the stored bytes from `offset` on, decrypted.
    pub fn decrypt(&self, stream: tidemark_core::ByteStream, offset: u64) -> tidemark_core::ByteStream {
        sse::crypt(stream, self.cipher.clone(), offset, None)
    }
}

/// The headers of a write that ask for encryption.
macro_rules! sse_headers {
    ($i:expr) => {
        crate::sse::Headers {
            sse: $i.server_side_encryption.as_ref().map(|v| v.as_str()),
            kms_key_id: $i.ssekms_key_id.as_deref(),
            customer_algorithm: $i.sse_customer_algorithm.as_deref(),
            customer_key: $i.sse_customer_key.as_deref(),
            customer_key_md5: $i.sse_customer_key_md5.as_deref(),
        }
    };
}
pub(super) use sse_headers;

impl Gateway {
    /// How a new object in `bucket` is encrypted: as its request asks, else as the bucket's
    /// default encryption says, else not. Refused in a remote mount: its objects are carried to
    /// the remote bucket, whose readers could not decrypt them.
    pub(super) async fn encrypting(
        &self,
        secure: bool,
        bucket_dir: &str,
        bucket: &Entry,
        h: Headers<'_>,
    ) -> S3Result<Option<Encrypting>> {
        let want = match sse::asked(h).map_err(refused)? {
            Some(Want::Customer(c)) => {
                check_secure(secure, &Some(c.clone()))?;
                Want::Customer(c)
            }
            Some(w) => w,
            None => match default_of(bucket) {
                Some(w) => w,
                None => return Ok(None),
            },
        };
        self.refuse_encryption_in_remote_mount(bucket_dir).await?;
        let (sealed, key) = Sealed::new(&want, self.keyring.as_deref()).map_err(refused)?;
        let customer = match &want {
            Want::Customer(c) => Some(c.clone()),
            _ => None,
        };
        Ok(Some(Encrypting { sealed, key, customer, plain_md5: PlainMd5::default() }))
    }

    /// The encryption of a part of `upload`: the upload's data key, opened with the part's
    /// customer key (which must be the upload's) or the keyring's.
    pub(super) fn encrypting_part(
        &self,
        upload: &Upload,
        customer: Option<CustomerKey>,
    ) -> S3Result<Option<Encrypting>> {
        let Some(sealed) = Sealed::of(&upload.extended).map_err(refused)? else {
            return match customer {
                Some(_) => Err(refused(Refusal::NotCustomer)),
                None => Ok(None),
            };
        };
        let key = sealed.open(customer.as_ref(), self.keyring.as_deref()).map_err(refused)?;
        Ok(Some(Encrypting { sealed, key, customer, plain_md5: PlainMd5::default() }))
    }

    /// How entry `e` is read: decrypted with the customer's key or the keyring's if it is
    /// encrypted (refused without the right key), as stored if it is not.
    pub(super) fn decrypting(&self, e: &Entry, customer: Option<&CustomerKey>) -> S3Result<Option<Decrypting>> {
        let Some(sealed) = Sealed::of(&e.extended).map_err(refused)? else {
            return match customer {
                Some(_) => Err(refused(Refusal::NotCustomer)),
                None => Ok(None),
            };
        };
        let key = sealed.open(customer, self.keyring.as_deref()).map_err(refused)?;
        let sizes = multipart::part_sizes(&e.extended, e.size);
        let cipher = Cipher::of_parts(&key, &sealed.ivs, &sizes).map_err(refused)?;
        Ok(Some(Decrypting { cipher, shown: Shown::of(&sealed, customer) }))
    }

    /// Encryption is refused in a bucket at or below a remote mount: its objects are carried to
    /// the remote bucket as stored, where its readers could not decrypt them.
    pub(super) async fn refuse_encryption_in_remote_mount(&self, bucket_dir: &str) -> S3Result<()> {
        match self.remote_mount_at(bucket_dir).await? {
            None => Ok(()),
            Some(m) => Err(s3_error!(
                NotImplemented,
                "bucket {:?} is (in) the remote mount {} of {}: its objects are the remote bucket's, stored as \
                 written; encrypt them there (the remote bucket's own default encryption)",
                path::name(bucket_dir),
                m.dir,
                m.location
            )),
        }
    }

    /// The remote mount `dir` is in or holds, if any.
    pub(super) async fn remote_mount_at(&self, dir: &str) -> S3Result<Option<tidemark_core::remote::Mount>> {
        let mounts: MountMapping =
            docs::read_json(&*self.filer, MOUNT_MAPPING).await.map_err(s3_err)?.map(|(m, _)| m).unwrap_or_default();
        Ok(mounts.mounts.into_iter().find(|m| path::is_within(&m.dir, dir) || path::is_within(dir, &m.dir)))
    }
}

/// What a bucket's default encryption asks of a write that asks for none.
fn default_of(bucket: &Entry) -> Option<Want> {
    let c: ServerSideEncryptionConfiguration = config_of(bucket, ATTR_ENCRYPTION)?;
    let d = c.rules.first()?.apply_server_side_encryption_by_default.as_ref()?;
    match d.sse_algorithm.as_str() {
        sse::KMS => Some(Want::Kms(d.kms_master_key_id.clone()?)),
        _ => Some(Want::S3),
    }
}

/// Checks a default encryption before it is kept: one rule, of an algorithm this gateway
/// honours, with keys its keyring has (else every write to the bucket would fail).
pub(super) fn check_default(c: &ServerSideEncryptionConfiguration, keyring: Option<&sse::Keyring>) -> S3Result<()> {
    let [rule] = c.rules.as_slice() else {
        return Err(s3_error!(MalformedXML, "a bucket's encryption has exactly one rule"));
    };
    let Some(d) = &rule.apply_server_side_encryption_by_default else {
        return Err(s3_error!(MalformedXML, "the rule names no ApplyServerSideEncryptionByDefault"));
    };
    let want = match d.sse_algorithm.as_str() {
        sse::AES256 if d.kms_master_key_id.is_some() => {
            return Err(s3_error!(InvalidArgument, "a KMSMasterKeyID with SSEAlgorithm AES256"));
        }
        sse::AES256 => Want::S3,
        sse::KMS => match &d.kms_master_key_id {
            Some(k) => Want::Kms(k.clone()),
            None => return Err(s3_error!(InvalidArgument, "SSEAlgorithm aws:kms needs its KMSMasterKeyID")),
        },
        other => return Err(s3_error!(InvalidArgument, "SSEAlgorithm {other:?}: AES256 or aws:kms")),
    };
    Sealed::new(&want, keyring).map(|_| ()).map_err(refused)
}

/// The attribute a part or object keeps its encryption in.
pub(super) fn set_sealed(ext: &mut BTreeMap<String, String>, enc: Option<&Encrypting>) {
    match enc {
        Some(e) => ext.insert(ATTR_SSE.into(), e.sealed.to_attr()),
        None => ext.remove(ATTR_SSE),
    };
}

/// A part's bytes encrypted under a new IV, and the attributes the part is stored with (its
/// sealed key and IV); as they are when the upload is not encrypted.
pub(super) fn encrypt_part(
    stream: tidemark_core::ByteStream,
    enc: Option<&mut Encrypting>,
) -> S3Result<(tidemark_core::ByteStream, Option<BTreeMap<String, String>>)> {
    let Some(x) = enc else { return Ok((stream, None)) };
    let stream = x.encrypt(stream)?;
    let mut ext = BTreeMap::new();
    set_sealed(&mut ext, Some(x));
    Ok((stream, Some(ext)))
}

/// SSE-C's response headers, where an output has no fields for them.
pub(super) fn customer_headers(headers: &mut hyper::HeaderMap, s: &Shown) {
    let pairs = [
        ("x-amz-server-side-encryption-customer-algorithm", &s.customer_algorithm),
        ("x-amz-server-side-encryption-customer-key-md5", &s.customer_key_md5),
    ];
    for (name, value) in pairs {
        if let Some(v) = value.as_deref().and_then(|v| hyper::header::HeaderValue::from_str(v).ok()) {
            headers.insert(name, v);
        }
    }
}
