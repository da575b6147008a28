//! Contexts: named, stateful kernels, each running one execution at a time.
//!
//! A context outlives its kernel processes: a crash, a restart or an interrupt that did not work
//! replaces the kernel under the same id. The kernel sits behind an async mutex that an execution
//! holds from start to end, which serialises runs; a restart or delete first kills the kernel
//! through its kill switch so it never waits behind a long run.

use super::kernel::{Kernel, KernelError, KillReason, KillSwitch};
use super::kernelspec::{Kernelspec, Kernelspecs};
use crate::config::Config;
use crate::users::User;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::OwnedMutexGuard;

/// Most contexts one sandbox may have: each can hold a kernel process, and a client that keeps
/// creating them would otherwise fill the sandbox with kernels.
pub const MAX_CONTEXTS: usize = 16;

/// The languages whose default contexts exist from the start (E2B lists both).
pub const DEFAULT_LANGUAGES: [&str; 2] = ["python", "javascript"];

/// The one default context whose kernel starts with the agent; the others start theirs on first
/// use. Sandboxes are restored from a checkpoint of a booted one, which should hold just a warm
/// Python kernel: a Deno kernel would cost some 200 MB in every restored image, and its
/// `Math.random` state cannot be reseeded after restore (Python's is, see `Kernel::execute`).
const PREWARMED: &str = "python";

/// Who a context's kernel runs as unless its create names a user: root, as in E2B's code
/// interpreter (so a cell may work anywhere, `/root` included). Commands still run as the
/// sandbox's default user.
const KERNEL_USER: &str = "root";

/// A context as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

/// The kernel of a context, if it has a live one.
#[derive(Default)]
pub struct Slot {
    pub kernel: Option<Kernel>,
}

pub type SlotGuard = OwnedMutexGuard<Slot>;

pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: PathBuf,
    /// The user its kernel runs as.
    pub user: String,
    pub spec: Kernelspec,
    slot: Arc<tokio::sync::Mutex<Slot>>,
    /// The current kernel's kill switch, usable while a run holds the slot.
    switch: Mutex<Option<Arc<KillSwitch>>>,
    /// Set by a delete, for requests that were already waiting for the slot.
    deleted: AtomicBool,
}

impl Context {
    fn new(language: &str, cwd: PathBuf, user: &str, spec: Kernelspec) -> Context {
        Context {
            id: uuid::Uuid::new_v4().to_string(),
            language: language.to_owned(),
            cwd,
            user: user.to_owned(),
            spec,
            slot: Arc::default(),
            switch: Mutex::new(None),
            deleted: AtomicBool::new(false),
        }
    }

    pub fn info(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            language: self.language.clone(),
            cwd: self.cwd.to_string_lossy().into_owned(),
        }
    }

    /// Waits for the running execution (or kernel start) to finish.
    pub async fn lock(&self) -> SlotGuard {
        self.slot.clone().lock_owned().await
    }

    /// Makes sure the slot holds a live kernel, starting a fresh one if needed.
    pub async fn ensure_kernel(&self, slot: &mut Slot, config: &Config) -> Result<(), KernelError> {
        if self.is_deleted() {
            return Err(KernelError::Setup(format!(
                "context {} was deleted",
                self.id
            )));
        }
        if slot.kernel.as_ref().is_some_and(Kernel::is_alive) {
            return Ok(());
        }
        *self.lock_switch() = None;
        slot.kernel = None;
        let settings = config.current();
        let user = User::lookup(&self.user).map_err(|e| KernelError::Setup(e.0.message))?;
        let kernel = Kernel::launch(
            &self.spec,
            &user,
            &self.cwd,
            &settings.env_vars,
            config.identity(),
        )
        .await?;
        *self.lock_switch() = Some(kernel.switch());
        slot.kernel = Some(kernel);
        Ok(())
    }

    fn lock_switch(&self) -> std::sync::MutexGuard<'_, Option<Arc<KillSwitch>>> {
        self.switch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the kernel: gracefully when idle, by killing it (which ends a run with an error
    /// naming `reason`) when busy.
    async fn stop(&self, reason: KillReason) -> SlotGuard {
        let mut slot = match self.slot.clone().try_lock_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if let Some(switch) = self.lock_switch().as_ref() {
                    switch.kill(reason);
                }
                self.lock().await
            }
        };
        *self.lock_switch() = None;
        if let Some(kernel) = slot.kernel.take() {
            kernel.shutdown().await;
        }
        slot
    }

    /// Replaces the kernel with a fresh one (same id), clearing all state.
    pub async fn restart(&self, config: &Config) -> Result<(), KernelError> {
        let mut slot = self.stop(KillReason::Restarted).await;
        self.ensure_kernel(&mut slot, config).await
    }

    /// Shuts the kernel down for good.
    pub async fn delete(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        self.stop(KillReason::Deleted).await;
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::SeqCst)
    }
}

/// An error answered before any output: plain text, as E2B's server does.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Internal(String),
}

/// All contexts of the sandbox, in creation order.
pub struct Interpreter {
    pub config: Arc<Config>,
    pub specs: Kernelspecs,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    contexts: Vec<Arc<Context>>,
    /// Language → id of its default context.
    defaults: HashMap<String, String>,
}

impl Interpreter {
    pub fn new(config: Arc<Config>, specs: Kernelspecs) -> Arc<Interpreter> {
        Arc::new(Interpreter {
            config,
            specs,
            registry: Mutex::default(),
        })
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the default contexts and starts the [`PREWARMED`] one's kernel in the
    /// background; a request for it meanwhile waits for its kernel.
    pub fn start_defaults(self: &Arc<Self>) {
        for language in DEFAULT_LANGUAGES {
            let Ok(ctx) = self.default_context(language) else {
                tracing::info!("no kernel for {language}: no default {language} context");
                continue;
            };
            if language != PREWARMED {
                continue;
            }
            let config = self.config.clone();
            tokio::spawn(async move {
                let mut slot = ctx.lock().await;
                if let Err(e) = ctx.ensure_kernel(&mut slot, &config).await {
                    tracing::warn!("starting the default {} context: {e}", ctx.language);
                }
            });
        }
    }

    fn spec_for(&self, language: &str) -> Result<Kernelspec, ApiError> {
        self.specs.for_language(language).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = [
                "python",
                "javascript",
                "typescript",
                "deno",
                "bash",
                "r",
                "java",
            ]
            .into_iter()
            .filter(|l| self.specs.for_language(l).is_some())
            .collect();
            known.dedup();
            ApiError::BadRequest(format!(
                "Unsupported language '{language}': this sandbox has kernels for {}",
                known.join(", ")
            ))
        })
    }

    /// Where contexts run unless told otherwise: the sandbox's workdir, else the default user's
    /// home, else `/home/user`.
    fn default_cwd(&self) -> PathBuf {
        let config = self.config.current();
        if let Some(dir) = config.default_workdir.filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        User::lookup(&config.default_user)
            .map(|u| u.home)
            .unwrap_or_else(|_| PathBuf::from("/home/user"))
    }

    /// The default context for a (normalised) language, registered on first use. JavaScript,
    /// TypeScript and Deno share one: the same Deno kernel serves them all, and each costs
    /// some 200 MB.
    pub fn default_context(&self, language: &str) -> Result<Arc<Context>, ApiError> {
        let language = match language {
            "typescript" | "deno" => "javascript",
            other => other,
        };
        let spec = self.spec_for(language)?;
        let cwd = self.default_cwd();
        let mut registry = self.registry();
        if let Some(id) = registry.defaults.get(language) {
            if let Some(ctx) = registry.contexts.iter().find(|c| &c.id == id) {
                return Ok(ctx.clone());
            }
        }
        let ctx = Arc::new(Context::new(language, cwd, KERNEL_USER, spec));
        registry
            .defaults
            .insert(language.to_owned(), ctx.id.clone());
        registry.contexts.push(ctx.clone());
        Ok(ctx)
    }

    /// Registers a new context whose kernel runs as `user` (default [`KERNEL_USER`]) in `cwd`
    /// (default the sandbox's workdir; a relative one is under the user's home); the caller
    /// starts its kernel.
    pub fn new_context(
        &self,
        language: &str,
        cwd: Option<&str>,
        user: Option<&str>,
    ) -> Result<Arc<Context>, ApiError> {
        let spec = self.spec_for(language)?;
        let user = user.filter(|u| !u.is_empty()).unwrap_or(KERNEL_USER);
        let found = User::lookup(user).map_err(|e| ApiError::BadRequest(e.0.message))?;
        let cwd = match cwd.filter(|c| !c.is_empty()) {
            None => self.default_cwd(),
            Some(cwd) => (found.resolve(cwd)).map_err(|e| ApiError::BadRequest(e.0.message))?,
        };
        if !cwd.is_dir() {
            return Err(ApiError::BadRequest(format!(
                "cwd '{}' does not exist or is not a directory",
                cwd.display()
            )));
        }
        let mut registry = self.registry();
        if registry.contexts.len() >= MAX_CONTEXTS {
            return Err(ApiError::TooMany(format!(
                "this sandbox already has {MAX_CONTEXTS} contexts, the most it may have; \
                 delete one first"
            )));
        }
        let ctx = Arc::new(Context::new(language, cwd, user, spec));
        registry.contexts.push(ctx.clone());
        Ok(ctx)
    }

    /// Reseeds every running kernel for identity generation `identity` now, rather than at its
    /// next run: a sandbox taken from the pool then runs its first cell without the extra
    /// snippet, in a kernel whose restored pages have already been touched.
    pub async fn reseed_all(&self, identity: u64) {
        let contexts: Vec<Arc<Context>> = self.registry().contexts.clone();
        for ctx in contexts {
            let mut slot = ctx.lock().await;
            if let Some(kernel) = slot.kernel.as_mut() {
                kernel.reseed(identity).await;
            }
        }
    }

    /// Drops every context, as a fresh server has none (their kernels have ended).
    pub fn forget_contexts(&self) {
        *self.registry() = Registry::default();
    }

    pub fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.registry()
            .contexts
            .iter()
            .find(|c| c.id == id)
            .cloned()
    }

    /// Unregisters a context (a removed default is recreated on next use).
    pub fn remove(&self, id: &str) -> Option<Arc<Context>> {
        let mut registry = self.registry();
        let index = registry.contexts.iter().position(|c| c.id == id)?;
        registry.defaults.retain(|_, default| default != id);
        Some(registry.contexts.remove(index))
    }

    pub fn list(&self) -> Vec<ContextInfo> {
        self.registry().contexts.iter().map(|c| c.info()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interpreter() -> (tempfile::TempDir, Arc<Interpreter>) {
        let dir = tempfile::tempdir().unwrap();
        for (name, lang) in [("python3", "python"), ("deno", "typescript")] {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
            std::fs::write(
                dir.path().join(name).join("kernel.json"),
                format!(
                    r#"{{"argv":["{name}","{{connection_file}}"],"display_name":"x","language":"{lang}"}}"#
                ),
            )
            .unwrap();
        }
        let specs = Kernelspecs::load(dir.path());
        // Contexts default to the sandbox's workdir; point it at a directory that exists here.
        let config = Arc::new(Config::default());
        config
            .apply_init(airlock_wire::envd::InitRequest {
                default_workdir: Some(dir.path().to_string_lossy().into_owned()),
                ..Default::default()
            })
            .unwrap();
        (dir, Interpreter::new(config, specs))
    }

    #[test]
    fn registry_keeps_defaults_first_and_unique() {
        let (_dir, interp) = interpreter();
        let py = interp.default_context("python").unwrap();
        let js = interp.default_context("javascript").unwrap();
        assert_eq!(interp.default_context("python").unwrap().id, py.id);
        let other = interp.new_context("python", Some("/"), None).unwrap();
        assert_eq!(interp.default_context("typescript").unwrap().id, js.id);
        assert_eq!(interp.default_context("deno").unwrap().id, js.id);
        let ts = interp.new_context("typescript", None, None).unwrap();
        let list = interp.list();
        let langs: Vec<&str> = list.iter().map(|c| c.language.as_str()).collect();
        assert_eq!(langs, ["python", "javascript", "python", "typescript"]);
        assert_eq!(list[3].id, ts.id);
        assert_eq!(list[2].cwd, "/");
        assert_eq!(list[2].id, other.id);

        assert!(matches!(
            interp.default_context("bash"),
            Err(ApiError::BadRequest(m)) if m.contains("python, javascript, typescript, deno")
        ));
        assert!(matches!(
            interp.new_context("python", Some("/nonexistent/dir"), None),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(
            interp.new_context("python", None, Some("nobody-of-that-name")),
            Err(ApiError::BadRequest(m)) if m.contains("nobody-of-that-name")
        ));
        assert_eq!(other.user, "root", "kernels run as root unless told");

        // A removed default is recreated, under a new id, at the end.
        assert!(interp.remove(&py.id).is_some());
        assert!(interp.get(&py.id).is_none());
        assert!(interp.remove(&py.id).is_none());
        let py2 = interp.default_context("python").unwrap();
        assert_ne!(py2.id, py.id);
        assert_eq!(interp.list().last().unwrap().id, py2.id);
    }

    #[test]
    fn contexts_are_capped_and_a_delete_makes_room() {
        let (_dir, interp) = interpreter();
        let made: Vec<_> = (0..MAX_CONTEXTS)
            .map(|_| interp.new_context("python", None, None).unwrap())
            .collect();
        assert!(matches!(
            interp.new_context("python", None, None),
            Err(ApiError::TooMany(_))
        ));
        interp.remove(&made[0].id).unwrap();
        interp.new_context("python", None, None).unwrap();
    }
}
