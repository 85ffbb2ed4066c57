//! The SQLite `MetaStore`: one file in the data directory, WAL mode, `synchronous=FULL` (a
//! committed transaction survives a crash of the process or the machine).
//!
//! Every mutation runs in one `BEGIN IMMEDIATE` transaction on the single writer connection, so
//! the fence check, the precondition check, the writes and the change-log records are atomic
//! and serialised. Reads use a small pool of read-only connections that WAL lets run beside the
//! writer. Paths are `TEXT` with SQLite's default `BINARY` collation, which compares UTF-8 bytes:
//! ordering by path is byte order.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::watch;

use tidemark_core::model::{
    Applied, ChangeRecord, Content, Entry, EntryKind, Fence, Lease, Mutation, NewEntry, Origin, Page, RemoteEntry, Txn,
};
use tidemark_core::{Clock, Error, MetaStore, Result, path};

/// The schema, one migration per version; `PRAGMA user_version` records how many have run.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE entries (
    path    TEXT PRIMARY KEY NOT NULL,
    parent  TEXT NOT NULL,
    version INTEGER NOT NULL,
    meta    TEXT NOT NULL,
    data    BLOB
) WITHOUT ROWID;
CREATE INDEX entries_by_parent ON entries (parent, path);
CREATE TABLE leases (
    name          TEXT PRIMARY KEY NOT NULL,
    holder        TEXT NOT NULL,
    generation    INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE changelog (
    seq    INTEGER PRIMARY KEY NOT NULL,
    ts_ms  INTEGER NOT NULL,
    path   TEXT NOT NULL,
    origin TEXT NOT NULL,
    old    TEXT,
    new    TEXT
);
-- The sequence counter lives apart from the change log so that trimming the log can never
-- make a sequence number (and so an entry version) be handed out twice.
CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters (name, value) VALUES ('seq', 0);
"#];

const READER_POOL: usize = 4;

pub struct SqliteStore {
    file: PathBuf,
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    clock: Arc<dyn Clock>,
    seq_tx: watch::Sender<u64>,
}

fn db_err(e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked) => {
            Error::Unavailable { message: format!("sqlite: {e}") }
        }
        _ => Error::Internal { message: format!("sqlite: {e}") },
    }
}

fn json_err(e: serde_json::Error) -> Error {
    Error::internal(format!("stored record is not valid JSON: {e}"))
}

impl SqliteStore {
    /// Opens (creating if needed) the store file and runs pending migrations.
    pub fn open(file: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self> {
        let file = file.as_ref().to_path_buf();
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        let mut writer = Connection::open(&file).map_err(db_err)?;
        writer
            .execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;")
            .map_err(db_err)?;
        migrate(&mut writer, clock.now_ms())?;
        let last: i64 =
            writer.query_row("SELECT value FROM counters WHERE name = 'seq'", [], |r| r.get(0)).map_err(db_err)?;
        let (seq_tx, _) = watch::channel(last as u64);
        Ok(SqliteStore {
            file,
            writer: Arc::new(Mutex::new(writer)),
            readers: Arc::new(Mutex::new(Vec::new())),
            clock,
            seq_tx,
        })
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    fn open_reader(&self) -> Result<Connection> {
        let c =
            Connection::open_with_flags(&self.file, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(db_err)?;
        c.execute_batch("PRAGMA busy_timeout = 5000;").map_err(db_err)?;
        Ok(c)
    }

    /// Runs `f` on a read connection from the pool, off the async executor.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let pooled = self.readers.lock().map_err(|_| Error::internal("reader pool poisoned"))?.pop();
        let conn = match pooled {
            Some(c) => c,
            None => self.open_reader()?,
        };
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let out = f(&conn);
            if let Ok(mut pool) = readers.lock()
                && pool.len() < READER_POOL
            {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| Error::internal(format!("store task failed: {e}")))?
    }

    /// Runs `f` in one IMMEDIATE transaction on the writer; commits only if `f` succeeds.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>, i64) -> Result<T> + Send + 'static,
    {
        let writer = self.writer.clone();
        let now = self.clock.now_ms();
        let (out, seq) = tokio::task::spawn_blocking(move || {
            let mut conn = writer.lock().map_err(|_| Error::internal("writer poisoned by an earlier panic"))?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
            let out = f(&tx, now)?;
            let seq = current_seq(&tx)?;
            tx.commit().map_err(db_err)?;
            Ok::<_, Error>((out, seq))
        })
        .await
        .map_err(|e| Error::internal(format!("store task failed: {e}")))??;
        self.seq_tx.send_if_modified(|cur| {
            let changed = *cur != seq;
            *cur = seq;
            changed
        });
        Ok(out)
    }
}

fn migrate(conn: &mut Connection, now_ms: i64) -> Result<()> {
    let version: usize = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).map_err(db_err)? as usize;
    if version > MIGRATIONS.len() {
        return Err(Error::internal(format!(
            "the store was written by a newer Tidemark (schema version {version}, this one knows {}); upgrade the binary",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
        tx.execute_batch(sql).map_err(db_err)?;
        if i == 0 {
            let root = Entry {
                path: path::ROOT.into(),
                kind: EntryKind::Dir,
                size: 0,
                mtime_ms: now_ms,
                mode: tidemark_core::model::DEFAULT_DIR_MODE,
                version: 0,
                remote: None,
                content: Content::Empty,
                extended: Default::default(),
            };
            put_row(&tx, &root, None)?;
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
    }
    Ok(())
}

fn parent_of(p: &str) -> &str {
    path::parent(p).unwrap_or("")
}

fn row_to_entry(path: String, version: i64, meta: String) -> Result<Entry> {
    let mut e: Entry = serde_json::from_str(&meta).map_err(json_err)?;
    e.path = path;
    e.version = version as u64;
    Ok(e)
}

fn get_entry(conn: &Connection, p: &str) -> Result<Option<Entry>> {
    let row = conn
        .query_row("SELECT path, version, meta FROM entries WHERE path = ?1", [p], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
        })
        .optional()
        .map_err(db_err)?;
    row.map(|(p, v, m)| row_to_entry(p, v, m)).transpose()
}

fn query_entries(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Entry>> {
    let mut stmt = conn.prepare_cached(sql).map_err(db_err)?;
    let rows = stmt
        .query_map(params, |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?)))
        .map_err(db_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (p, v, m) = row.map_err(db_err)?;
        out.push(row_to_entry(p, v, m)?);
    }
    Ok(out)
}

/// Every entry strictly below `dir`, in byte order of the path.
fn descendants(conn: &Connection, dir: &str, start_after: &str, limit: i64) -> Result<Vec<Entry>> {
    let (lo, hi) = path::descendant_bounds(dir);
    // One lower bound per query: given both (`path >= lo AND path > after`), SQLite seeks to `lo`
    // and filters from there, so every page rescanned the directory from its start (a reconcile
    // of 1,000,000 objects went quadratic).
    if start_after > lo.as_str() {
        query_entries(
            conn,
            "SELECT path, version, meta FROM entries WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3",
            params![start_after, hi, limit],
        )
    } else {
        query_entries(
            conn,
            "SELECT path, version, meta FROM entries WHERE path >= ?1 AND path < ?2 ORDER BY path LIMIT ?3",
            params![lo, hi, limit],
        )
    }
}

fn put_row(conn: &Connection, e: &Entry, data: Option<&[u8]>) -> Result<()> {
    let meta = serde_json::to_string(e).map_err(json_err)?;
    conn.prepare_cached(
        "INSERT INTO entries (path, parent, version, meta, data) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (path) DO UPDATE SET version = excluded.version, meta = excluded.meta, data = excluded.data",
    )
    .map_err(db_err)?
    .execute(params![e.path, parent_of(&e.path), e.version as i64, meta, data])
    .map_err(db_err)?;
    Ok(())
}

fn inline_data(conn: &Connection, p: &str) -> Result<Option<Vec<u8>>> {
    let data: Option<Option<Vec<u8>>> =
        conn.query_row("SELECT data FROM entries WHERE path = ?1", [p], |r| r.get(0)).optional().map_err(db_err)?;
    Ok(data.flatten())
}

fn current_seq(conn: &Connection) -> Result<u64> {
    let v: i64 = conn.query_row("SELECT value FROM counters WHERE name = 'seq'", [], |r| r.get(0)).map_err(db_err)?;
    Ok(v as u64)
}

fn next_seq(conn: &Connection) -> Result<u64> {
    let v: i64 = conn
        .query_row("UPDATE counters SET value = value + 1 WHERE name = 'seq' RETURNING value", [], |r| r.get(0))
        .map_err(db_err)?;
    Ok(v as u64)
}

fn log_change(
    conn: &Connection,
    seq: u64,
    ts_ms: i64,
    p: &str,
    origin: Origin,
    old: Option<&Entry>,
    new: Option<&Entry>,
) -> Result<()> {
    let enc = |e: Option<&Entry>| e.map(serde_json::to_string).transpose().map_err(json_err);
    conn.prepare_cached("INSERT INTO changelog (seq, ts_ms, path, origin, old, new) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
        .map_err(db_err)?
        .execute(params![seq as i64, ts_ms, p, origin.as_str(), enc(old)?, enc(new)?])
        .map_err(db_err)?;
    Ok(())
}

fn get_lease(conn: &Connection, name: &str) -> Result<Option<Lease>> {
    conn.query_row("SELECT name, holder, generation, expires_at_ms FROM leases WHERE name = ?1", [name], |r| {
        Ok(Lease {
            name: r.get(0)?,
            holder: r.get(1)?,
            generation: r.get::<_, i64>(2)? as u64,
            expires_at_ms: r.get(3)?,
        })
    })
    .optional()
    .map_err(db_err)
}

/// The fence holds if the lease row names this holder and generation and has not expired.
fn check_fence(conn: &Connection, fence: &Fence, now_ms: i64) -> Result<Lease> {
    match get_lease(conn, &fence.lease)? {
        Some(l) if l.holder == fence.holder && l.generation == fence.generation && l.expires_at_ms > now_ms => Ok(l),
        other => Err(Error::Fenced { lease: fence.lease.clone(), current_generation: other.map(|l| l.generation) }),
    }
}

fn apply_txn(tx: &Connection, txn: Txn, now_ms: i64) -> Result<Applied> {
    txn.validate()?;
    if let Some(f) = &txn.fence {
        check_fence(tx, f, now_ms)?;
    }
    let first_seq = current_seq(tx)? + 1;
    let current = get_entry(tx, &txn.path)?;
    if !txn.precondition.holds(current.as_ref().map(|e| e.version)) {
        return Err(Error::PreconditionFailed { path: txn.path.clone(), current: current.map(|e| e.version) });
    }
    match txn.mutation {
        Mutation::Put { entry, data } => {
            for anc in path::ancestors(&txn.path) {
                match get_entry(tx, anc)? {
                    Some(e) if e.is_dir() => {}
                    Some(_) => return Err(Error::NotADirectory { path: anc.to_string() }),
                    None => {
                        let seq = next_seq(tx)?;
                        let dir = materialise(anc, seq, implied_parent(&entry));
                        put_row(tx, &dir, None)?;
                        log_change(tx, seq, now_ms, anc, txn.origin, None, Some(&dir))?;
                    }
                }
            }
            if let Some(cur) = &current
                && cur.is_dir()
                && entry.kind == EntryKind::File
                && !descendants(tx, &txn.path, "", 1)?.is_empty()
            {
                return Err(Error::DirectoryNotEmpty { path: txn.path.clone() });
            }
            let kept: Option<Vec<u8>> = match (&entry.content, &data) {
                (Content::Inline, None) => {
                    let bytes = match &current {
                        Some(cur) if cur.content == Content::Inline => inline_data(tx, &txn.path)?,
                        _ => None,
                    };
                    match bytes {
                        Some(b) if b.len() as u64 == entry.size => Some(b),
                        Some(_) => {
                            return Err(Error::invalid_argument(
                                "a metadata update cannot change the size of inline content",
                            ));
                        }
                        None => {
                            return Err(Error::invalid_argument(
                                "inline content without data, and the entry has none to keep",
                            ));
                        }
                    }
                }
                _ => None,
            };
            let seq = next_seq(tx)?;
            let new = materialise(&txn.path, seq, entry);
            put_row(tx, &new, data.as_deref().or(kept.as_deref()))?;
            log_change(tx, seq, now_ms, &txn.path, txn.origin, current.as_ref(), Some(&new))?;
            Ok(Applied { first_seq, seq, old: current, new: Some(new) })
        }
        Mutation::Delete { recursive } => {
            let Some(cur) = current else {
                return Err(Error::not_found(&txn.path));
            };
            if cur.is_dir() {
                let below = descendants(tx, &txn.path, "", i64::MAX)?;
                if !below.is_empty() && !recursive {
                    return Err(Error::DirectoryNotEmpty { path: txn.path.clone() });
                }
                // Reverse byte order removes every child before its parent, so a follower of the
                // change log never sees a directory deleted while something below it remains.
                for child in below.iter().rev() {
                    let seq = next_seq(tx)?;
                    tx.execute("DELETE FROM entries WHERE path = ?1", [&child.path]).map_err(db_err)?;
                    log_change(tx, seq, now_ms, &child.path, txn.origin, Some(child), None)?;
                }
            }
            let seq = next_seq(tx)?;
            tx.execute("DELETE FROM entries WHERE path = ?1", [&txn.path]).map_err(db_err)?;
            log_change(tx, seq, now_ms, &txn.path, txn.origin, Some(&cur), None)?;
            Ok(Applied { first_seq, seq, old: Some(cur), new: None })
        }
    }
}

/// A directory created because an entry below it was written. Below a remote-backed entry it is
/// remote-backed too, with an empty etag: implied by the keys below it, not by a marker object,
/// so a reconcile may remove it once it is empty.
fn implied_parent(child: &NewEntry) -> NewEntry {
    let mut dir = NewEntry::dir(child.mtime_ms);
    dir.remote = child.remote.as_ref().map(|r| RemoteEntry {
        storage: r.storage.clone(),
        etag: String::new(),
        remote_mtime_ms: child.mtime_ms,
        remote_size: 0,
        version_id: None,
        last_local_sync_ms: None,
    });
    dir
}

fn materialise(p: &str, version: u64, e: NewEntry) -> Entry {
    Entry {
        path: p.to_string(),
        kind: e.kind,
        size: e.size,
        mtime_ms: e.mtime_ms,
        mode: e.mode,
        version,
        remote: e.remote,
        content: e.content,
        extended: e.extended,
    }
}

fn check_ttl(ttl_ms: i64) -> Result<()> {
    if ttl_ms <= 0 {
        return Err(Error::invalid_argument(format!("lease ttl must be positive, got {ttl_ms} ms")));
    }
    Ok(())
}

#[async_trait]
impl MetaStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn get(&self, p: &str) -> Result<Option<Entry>> {
        path::validate(p)?;
        let p = p.to_string();
        self.read(move |c| get_entry(c, &p)).await
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        path::validate(dir)?;
        let dir = dir.to_string();
        let after = start_after.unwrap_or("").to_string();
        self.read(move |c| {
            match get_entry(c, &dir)? {
                None => return Err(Error::not_found(&dir)),
                Some(e) if !e.is_dir() => return Err(Error::NotADirectory { path: dir }),
                Some(_) => {}
            }
            let rows = query_entries(
                c,
                "SELECT path, version, meta FROM entries WHERE parent = ?1 AND path > ?2 ORDER BY path LIMIT ?3",
                params![dir, after, limit as i64 + 1],
            )?;
            Ok(Page::from_rows(rows, limit))
        })
        .await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        path::validate(dir)?;
        let dir = dir.to_string();
        let after = start_after.unwrap_or("").to_string();
        self.read(move |c| Ok(Page::from_rows(descendants(c, &dir, &after, limit as i64 + 1)?, limit))).await
    }

    async fn count_below(&self, dir: &str) -> Result<u64> {
        path::validate(dir)?;
        let (lo, hi) = path::descendant_bounds(dir);
        self.read(move |c| {
            let n: i64 = c
                .query_row(
                    "SELECT COUNT(*) FROM entries WHERE path >= ?1 AND path < ?2 AND path <> '/'",
                    params![lo, hi],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            Ok(n as u64)
        })
        .await
    }

    async fn read_inline(&self, p: &str) -> Result<Option<Bytes>> {
        path::validate(p)?;
        let p = p.to_string();
        self.read(move |c| {
            let data: Option<Option<Vec<u8>>> = c
                .query_row("SELECT data FROM entries WHERE path = ?1", [&p], |r| r.get(0))
                .optional()
                .map_err(db_err)?;
            Ok(data.flatten().map(Bytes::from))
        })
        .await
    }

    async fn apply(&self, txn: Txn) -> Result<Applied> {
        self.write(move |tx, now| apply_txn(tx, txn, now)).await
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<Lease> {
        check_ttl(ttl_ms)?;
        let (name, holder) = (name.to_string(), holder.to_string());
        self.write(move |tx, now| {
            let current = get_lease(tx, &name)?;
            if let Some(l) = &current
                && l.expires_at_ms > now
                && l.holder != holder
            {
                return Err(Error::LeaseHeld { lease: name, holder: l.holder.clone(), expires_at_ms: l.expires_at_ms });
            }
            let lease = Lease {
                generation: current.map_or(1, |l| l.generation + 1),
                name,
                holder,
                expires_at_ms: now.saturating_add(ttl_ms),
            };
            tx.execute(
                "INSERT INTO leases (name, holder, generation, expires_at_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, generation = excluded.generation,
                 expires_at_ms = excluded.expires_at_ms",
                params![lease.name, lease.holder, lease.generation as i64, lease.expires_at_ms],
            )
            .map_err(db_err)?;
            Ok(lease)
        })
        .await
    }

    async fn lease_renew(&self, fence: &Fence, ttl_ms: i64) -> Result<Lease> {
        check_ttl(ttl_ms)?;
        let fence = fence.clone();
        self.write(move |tx, now| {
            let mut lease = check_fence(tx, &fence, now)?;
            lease.expires_at_ms = now.saturating_add(ttl_ms);
            tx.execute(
                "UPDATE leases SET expires_at_ms = ?2 WHERE name = ?1",
                params![lease.name, lease.expires_at_ms],
            )
            .map_err(db_err)?;
            Ok(lease)
        })
        .await
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        let fence = fence.clone();
        self.write(move |tx, _now| {
            match get_lease(tx, &fence.lease)? {
                // An expired lease that nobody has taken since is still ours to release.
                Some(l) if l.holder == fence.holder && l.generation == fence.generation => {}
                other => {
                    return Err(Error::Fenced {
                        lease: fence.lease.clone(),
                        current_generation: other.map(|l| l.generation),
                    });
                }
            }
            tx.execute("UPDATE leases SET expires_at_ms = 0 WHERE name = ?1", [&fence.lease]).map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        let name = name.to_string();
        self.read(move |c| get_lease(c, &name)).await
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<ChangeRecord>> {
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT seq, ts_ms, path, origin, old, new FROM changelog WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![after as i64, limit as i64], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                    ))
                })
                .map_err(db_err)?;
            let dec = |s: Option<String>| s.map(|s| serde_json::from_str::<Entry>(&s)).transpose().map_err(json_err);
            let mut out = Vec::new();
            for row in rows {
                let (seq, ts_ms, path, origin, old, new) = row.map_err(db_err)?;
                let origin = Origin::parse(&origin)
                    .ok_or_else(|| Error::internal(format!("unknown origin {origin:?} in the change log")))?;
                out.push(ChangeRecord { seq: seq as u64, ts_ms, path, origin, old: dec(old)?, new: dec(new)? });
            }
            Ok(out)
        })
        .await
    }

    async fn last_seq(&self) -> Result<u64> {
        self.read(current_seq).await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.seq_tx.subscribe()
    }
}
