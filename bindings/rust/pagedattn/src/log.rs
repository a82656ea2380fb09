//! The library's log messages, delivered to a Rust closure (`pagedattn_set_log_callback`).

use std::borrow::Cow;
use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Mutex, PoisonError};

use crate::{check, sys, Error, Result, Status};

/// Severity of a log message, most severe first (so `Error < Info < Debug`): a callback set for
/// a level receives the messages of that level and of the more severe ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// A call failed: `"<status name>: <the error's message>"`.
    Error,
    /// A backend was created (its name and settings), and what "auto" picked and passed over.
    Info,
    /// A cache or batch was created or destroyed, with its sizes in bytes.
    Debug,
}

impl LogLevel {
    /// The C `pagedattn_log_level` value.
    pub fn raw(self) -> sys::pagedattn_log_level {
        match self {
            LogLevel::Error => sys::PAGEDATTN_LOG_ERROR,
            LogLevel::Info => sys::PAGEDATTN_LOG_INFO,
            LogLevel::Debug => sys::PAGEDATTN_LOG_DEBUG,
        }
    }

    /// Maps a C `pagedattn_log_level`; `None` for a value this binding does not know.
    pub fn from_raw(raw: sys::pagedattn_log_level) -> Option<LogLevel> {
        [LogLevel::Error, LogLevel::Info, LogLevel::Debug].into_iter().find(|l| l.raw() == raw)
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogLevel::Error => "ERROR",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
        })
    }
}

/// A log sink for [`set_log_callback`]: receives each message's level and text (one line, no
/// newline). It runs on the thread that made the call being logged, possibly on several threads
/// at once, hence `Send + Sync`.
pub type LogCallback = Box<dyn Fn(LogLevel, &str) + Send + Sync + 'static>;

/// The closure the library calls now. Boxed once more so that a thin pointer to it travels as
/// the C `user_data`; it stays here, alive, until a later successful set replaces it. The lock
/// only orders setters: the trampoline never takes it, since the library holds its own lock
/// around every call of the callback and a setter waits for those calls.
static CURRENT: Mutex<Option<Box<LogCallback>>> = Mutex::new(None);

thread_local! {
    /// Whether this thread is inside the callback, where setting a callback would deadlock
    /// against a setter on another thread that waits for this call to end.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as inside the callback until dropped.
struct InCallback;

impl InCallback {
    fn enter() -> InCallback {
        IN_CALLBACK.with(|f| f.set(true));
        InCallback
    }
}

impl Drop for InCallback {
    fn drop(&mut self) {
        IN_CALLBACK.with(|f| f.set(false));
    }
}

/// The C callback: forwards one message to the closure at `user_data`.
///
/// # Safety
/// `user_data` must point to a live `LogCallback` (the one in `CURRENT`, which the library
/// stops calling before it is replaced) and `message` be NULL or a NUL-terminated string.
unsafe extern "C" fn trampoline(user_data: *mut c_void, level: sys::pagedattn_log_level, message: *const c_char) {
    let _inside = InCallback::enter();
    // A panic must not unwind into C: it is caught here and dropped (the panic hook has already
    // printed it), and the logged call goes on as it would without a callback.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as the function's contract.
        let callback = unsafe { &*(user_data as *const LogCallback) };
        let text = if message.is_null() {
            Cow::Borrowed("")
        } else {
            // SAFETY: valid for this call; copied only where it is not UTF-8.
            unsafe { CStr::from_ptr(message) }.to_string_lossy()
        };
        callback(LogLevel::from_raw(level).unwrap_or(LogLevel::Debug), &text);
    }));
}

/// Sends the library's messages at `max_level` and above to `callback`, process-wide, replacing
/// any earlier callback; `None` stops logging (the default).
///
/// The closure is kept alive until it is replaced. Once this function returns, the previous
/// closure is not running and is not called again, and it has been dropped. Calls made from
/// inside the callback are not logged; a panic in it is caught (never unwinding into C) and
/// ignored.
///
/// Fails with [`Status::InvalidArgument`] when called from inside the callback; the earlier
/// callback then stays.
///
/// ```
/// use pagedattn::{set_log_callback, LogLevel};
/// set_log_callback(Some(Box::new(|level: LogLevel, message: &str| eprintln!("pagedattn {level}: {message}"))),
///                  LogLevel::Info).unwrap();
/// let _ = pagedattn::Backend::new("cpu"); // logs "cpu: backend created on device 0: ..."
/// set_log_callback(None, LogLevel::Error).unwrap();
/// ```
pub fn set_log_callback(callback: Option<LogCallback>, max_level: LogLevel) -> Result<()> {
    if IN_CALLBACK.with(Cell::get) {
        return Err(Error::binding(Status::InvalidArgument, "set_log_callback called from inside the log callback"));
    }
    let new: Option<Box<LogCallback>> = callback.map(Box::new);
    let user_data = new.as_deref().map_or(ptr::null_mut(), |cb| cb as *const LogCallback as *mut c_void);
    let function: sys::pagedattn_log_fn = if new.is_some() { Some(trampoline) } else { None };
    // A poisoned lock only means a setter panicked (dropping an old closure): the slot is sound.
    let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
    // SAFETY: `user_data` points into `new`'s heap box, which moves into CURRENT below and stays
    // there until the library has stopped calling it; on failure the library keeps the old one.
    check(unsafe { sys::pagedattn_set_log_callback(function, user_data, max_level.raw()) })?;
    let old = std::mem::replace(&mut *current, new);
    drop(current);
    // The library no longer calls the old closure, so dropping it is safe; done outside the lock
    // since its destructor is the caller's code.
    drop(old);
    Ok(())
}
