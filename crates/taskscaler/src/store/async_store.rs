//! [`AsyncStateStore`]: a [`StateStore`] on its own OS thread, called from async code.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::thread;

use tokio::sync::oneshot;

use super::{
    InstanceRecord, PendingReport, RestorePlan, Snapshot, StateStore, StoreError, StoreIdentity,
};

type Job = Box<dyn FnOnce(&mut StateStore) + Send>;

enum Msg {
    Call(Job),
    Close(oneshot::Sender<()>),
}

/// A [`StateStore`] owned by one dedicated OS thread. Calls go over a channel and run one at a
/// time in the order they were sent, so async code never blocks on disk and a record sent before
/// another is written before it. Clones share the thread; it ends (closing the file) on
/// [`close`](Self::close) or when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct AsyncStateStore {
    tx: mpsc::Sender<Msg>,
    path: Arc<PathBuf>,
}

impl AsyncStateStore {
    /// Open (or create) the store at `path` on a new thread; see [`StateStore::open`].
    pub async fn open(
        path: impl AsRef<Path>,
        identity: &StoreIdentity,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let identity = identity.clone();
        let (ready_tx, ready_rx) = oneshot::channel();
        let p = path.clone();
        let (tx, rx) = mpsc::channel::<Msg>();
        spawn(&path, move || match StateStore::open(&p, &identity) {
            Ok(store) => {
                let _ = ready_tx.send(Ok(()));
                serve(store, rx);
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })?;
        ready_rx.await.map_err(|_| StoreError::Closed)??;
        Ok(AsyncStateStore {
            tx,
            path: Arc::new(path),
        })
    }

    /// Move an open store onto a new thread.
    pub fn from_store(store: StateStore) -> Result<Self, StoreError> {
        let path = store.path().to_path_buf();
        let (tx, rx) = mpsc::channel::<Msg>();
        spawn(&path, move || serve(store, rx))?;
        Ok(AsyncStateStore {
            tx,
            path: Arc::new(path),
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` on the store's thread, after every call sent before it.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut StateStore) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        let job: Job = Box::new(move |store| {
            let _ = reply_tx.send(f(store));
        });
        self.tx
            .send(Msg::Call(job))
            .map_err(|_| StoreError::Closed)?;
        reply_rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Queue `f` without waiting for it: it still runs after every call sent before it and
    /// before every call sent after it. Failures are logged (`what` names the write).
    pub fn enqueue<F>(&self, what: &'static str, f: F)
    where
        F: FnOnce(&mut StateStore) -> Result<(), StoreError> + Send + 'static,
    {
        let path = self.path.clone();
        let job: Job = Box::new(move |store| {
            if let Err(e) = f(store) {
                tracing::error!(store = %path.display(), error = %e, "state store: {what} failed");
            }
        });
        if self.tx.send(Msg::Call(job)).is_err() {
            tracing::error!(store = %self.path.display(), "state store closed: {what} not written");
        }
    }

    /// Close the store once the calls already sent have run, and wait for the file to be closed
    /// (so it can be reopened). Later calls, from any clone, fail with [`StoreError::Closed`].
    pub async fn close(self) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(Msg::Close(done_tx)).is_ok() {
            let _ = done_rx.await;
        }
    }

    /// See [`StateStore::record_instance`].
    pub async fn record_instance(&self, rec: InstanceRecord) -> Result<(), StoreError> {
        self.call(move |s| s.record_instance(&rec)).await
    }

    /// See [`StateStore::increment_use`].
    pub async fn increment_use(
        &self,
        instance: impl Into<String>,
        key: impl Into<String>,
        slot: u32,
        job_ref: impl Into<String>,
    ) -> Result<u64, StoreError> {
        let (instance, key, job_ref) = (instance.into(), key.into(), job_ref.into());
        self.call(move |s| s.increment_use(&instance, &key, slot, &job_ref))
            .await
    }

    /// See [`StateStore::release`].
    pub async fn release(&self, key: impl Into<String>) -> Result<bool, StoreError> {
        let key = key.into();
        self.call(move |s| s.release(&key)).await
    }

    /// See [`StateStore::mark_removing`].
    pub async fn mark_removing(&self, id: impl Into<String>) -> Result<bool, StoreError> {
        let id = id.into();
        self.call(move |s| s.mark_removing(&id)).await
    }

    /// See [`StateStore::forget_instance`].
    pub async fn forget_instance(&self, id: impl Into<String>) -> Result<bool, StoreError> {
        let id = id.into();
        self.call(move |s| s.forget_instance(&id)).await
    }

    /// See [`StateStore::load`].
    pub async fn load(&self) -> Result<Snapshot, StoreError> {
        self.call(|s| s.load()).await
    }

    /// See [`StateStore::put_report`].
    pub async fn put_report(
        &self,
        job_id: impl Into<String>,
        state_json: impl Into<String>,
    ) -> Result<(), StoreError> {
        let (job_id, state_json) = (job_id.into(), state_json.into());
        self.call(move |s| s.put_report(&job_id, &state_json)).await
    }

    /// See [`StateStore::take_reports`].
    pub async fn take_reports(&self) -> Result<Vec<PendingReport>, StoreError> {
        self.call(|s| s.take_reports()).await
    }

    /// See [`StateStore::ack_report`].
    pub async fn ack_report(&self, job_id: impl Into<String>) -> Result<bool, StoreError> {
        let job_id = job_id.into();
        self.call(move |s| s.ack_report(&job_id)).await
    }

    /// See [`StateStore::apply_restore`].
    pub async fn apply_restore(
        &self,
        plan: RestorePlan,
        reports: Vec<(String, String)>,
    ) -> Result<Vec<String>, StoreError> {
        self.call(move |s| s.apply_restore(&plan, &reports)).await
    }
}

fn spawn(path: &Path, f: impl FnOnce() + Send + 'static) -> Result<(), StoreError> {
    thread::Builder::new()
        .name("slipway-state".into())
        .spawn(f)
        .map(|_| ())
        .map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            op: "spawn store thread",
            source,
        })
}

fn serve(mut store: StateStore, rx: mpsc::Receiver<Msg>) {
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Call(job) => job(&mut store),
            Msg::Close(done) => {
                drop(store);
                let _ = done.send(());
                return;
            }
        }
    }
}
