//! System documents (JSON files under `/etc/tidemark/`) read and written through any `Filer`,
//! conditionally, so two operators editing the same document cannot lose each other's change.

use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use tidemark_core::model::{Origin, Precondition};
use tidemark_core::{Error, Filer, Result, WriteOptions};

/// The document at `path` and its version; `None` if absent.
pub async fn read_json<T: DeserializeOwned>(filer: &dyn Filer, path: &str) -> Result<Option<(T, u64)>> {
    let (entry, mut stream) = match filer.read(path, None).await {
        Ok(r) => r,
        Err(Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::with_capacity(entry.size as usize);
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk.map_err(|e| Error::io(format!("reading {path}"), e))?);
    }
    let doc = serde_json::from_slice(&bytes)
        .map_err(|e| Error::internal(format!("{path} is not a valid document ({e}); fix or remove it")))?;
    Ok(Some((doc, entry.version)))
}

/// Writes `doc` to `path` if the document is still at `expected` (`None`: still absent).
/// `PreconditionFailed` means someone else changed it: read again and retry.
pub async fn write_json<T: Serialize>(filer: &dyn Filer, path: &str, doc: &T, expected: Option<u64>) -> Result<u64> {
    let bytes = serde_json::to_vec_pretty(doc).map_err(Error::internal)?;
    let body = futures::stream::once(async move { Ok(Bytes::from(bytes)) }).boxed();
    let precondition = expected.map_or(Precondition::Absent, Precondition::Version);
    let opts = WriteOptions { precondition, origin: Origin::System, ..Default::default() };
    Ok(filer.write(path, body, opts).await?.version)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Cluster {
    id: String,
}

/// This cluster's id (`/etc/tidemark/cluster.json`), created by whoever asks first.
pub async fn cluster_id(filer: &dyn Filer) -> Result<String> {
    use tidemark_core::remote::system_paths::CLUSTER;
    if let Some((c, _)) = read_json::<Cluster>(filer, CLUSTER).await? {
        return Ok(c.id);
    }
    let id = tidemark_core::ids::random_hex(8, "a cluster id")?;
    match write_json(filer, CLUSTER, &Cluster { id: id.clone() }, None).await {
        Ok(_) => Ok(id),
        // Someone created it first: theirs is the cluster's.
        Err(Error::PreconditionFailed { .. }) => read_json::<Cluster>(filer, CLUSTER)
            .await?
            .map(|(c, _)| c.id)
            .ok_or_else(|| Error::internal("the cluster id vanished")),
        Err(e) => Err(e),
    }
}

/// The tombstone of a user's delete of `path` waiting for the outbound sync, if any.
pub async fn tombstone(filer: &dyn Filer, path: &str) -> Result<Option<tidemark_core::decide::Tombstone>> {
    use tidemark_core::remote::system_paths;
    Ok(read_json(filer, &system_paths::tombstone(path)).await?.map(|(t, _)| t))
}

/// Removes the tombstone of `path` (the outbound sync propagated the delete, or the path holds
/// something again). Absent is fine.
pub async fn remove_tombstone(filer: &dyn Filer, path: &str) -> Result<()> {
    use tidemark_core::model::Txn;
    use tidemark_core::remote::system_paths;
    match filer.apply(Txn::delete(system_paths::tombstone(path), false, Origin::System)).await {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
