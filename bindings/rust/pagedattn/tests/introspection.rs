//! Introspection and logging: a backend's target and settings, its memory usage, a batch's
//! sizes, and the log callback.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pagedattn::{set_log_callback, Backend, BackendOptions, Batch, BatchDesc, CacheDesc, DType, KvCache, LogLevel,
                MemoryUsage, Status};

fn desc() -> CacheDesc {
    CacheDesc { num_layers: 2, num_blocks: 8, block_size: 4, num_kv_heads: 2, head_size: 8,
                dtype: DType::F32, ..CacheDesc::default() }
}

#[test]
fn capabilities_name_the_target_and_the_settings() {
    let caps = Backend::new("cpu").unwrap().capabilities().unwrap();
    assert!(!caps.target.is_empty());
    assert!(!caps.settings.is_empty());
    // The CPU backend's line names its target and every variable it read.
    assert!(caps.settings.contains(&caps.target), "settings: {}", caps.settings);
    assert!(caps.settings.contains("PAGEDATTN_CPU_SPIN_US"), "settings: {}", caps.settings);
    assert!(!caps.settings.contains('\n'));
}

#[test]
fn memory_usage_counts_a_cache_and_a_batch_and_returns_to_zero() {
    let limit = 1 << 30;
    let be = Backend::with_options("cpu", &BackendOptions { memory_limit: limit, ..BackendOptions::default() })
        .unwrap();
    let empty = MemoryUsage { bytes_in_use: 0, memory_limit: limit, num_caches: 0, num_batches: 0 };
    assert_eq!(be.memory_usage().unwrap(), empty);

    let d = desc();
    let cache_bytes = d.bytes_per_block().unwrap() * d.num_blocks as u64;
    let cache = KvCache::new(&be, &d).unwrap();
    assert_eq!(be.memory_usage().unwrap(),
               MemoryUsage { bytes_in_use: cache_bytes, num_caches: 1, ..empty });

    let mut batch = Batch::new(&be, Some(&cache), None, &BatchDesc {
        query_lens: &[3, 1], context_lens: &[0, 5], block_tables: Some(&[0, 1, 2, 3]), block_table_stride: 2,
        ..BatchDesc::default()
    }).unwrap();
    let info = batch.info().unwrap();
    assert!(info.host_bytes > 0 && info.workspace_bytes > 0, "{info:?}");
    // Default capacities: the table width passed, and what it addresses (2 blocks of 4).
    assert_eq!((info.max_blocks_per_seq, info.max_seq_len_capacity, info.max_num_encoder_tokens), (2, 8, 0));
    let with_batch = MemoryUsage {
        bytes_in_use: cache_bytes + info.host_bytes + info.workspace_bytes, num_caches: 1, num_batches: 1, ..empty
    };
    assert_eq!(be.memory_usage().unwrap(), with_batch);

    // The sizes follow the capacities, so a smaller step keeps them.
    batch.update(&BatchDesc { query_lens: &[1], context_lens: &[2], block_tables: Some(&[4, 0]),
                              block_table_stride: 2, ..BatchDesc::default() }).unwrap();
    let after = batch.info().unwrap();
    assert_eq!((after.host_bytes, after.workspace_bytes), (info.host_bytes, info.workspace_bytes));
    assert_eq!(be.memory_usage().unwrap(), with_batch);

    drop(batch);
    assert_eq!(be.memory_usage().unwrap(), MemoryUsage { bytes_in_use: cache_bytes, num_caches: 1, ..empty });
    drop(cache);
    assert_eq!(be.memory_usage().unwrap(), empty);
}

/// The callback is process-wide: the tests that set it hold this lock.
static LOG_TESTS: Mutex<()> = Mutex::new(());

/// Keeps only the messages of its own thread, since other tests run (and log) on other threads.
#[test]
fn log_callback_gets_errors_and_backend_creation_then_is_removed() {
    let _serial = LOG_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let me = thread::current().id();
    let seen: Arc<Mutex<Vec<(LogLevel, String)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    set_log_callback(Some(Box::new(move |level: LogLevel, message: &str| {
        if thread::current().id() == me {
            sink.lock().unwrap().push((level, message.to_string()));
        }
    })), LogLevel::Info).unwrap();

    let err = Backend::new("no-such-backend").unwrap_err();
    let backend = Backend::new("cpu").unwrap();
    let settings = backend.capabilities().unwrap().settings;
    let cache = KvCache::new(&backend, &desc()).unwrap(); // DEBUG: below the level set
    {
        let seen = seen.lock().unwrap();
        let error = format!("{}: {}", err.status.name(), err.message);
        assert!(seen.contains(&(LogLevel::Error, error.clone())), "want {error:?} in {seen:?}");
        assert!(seen.iter().any(|(level, m)| *level == LogLevel::Info && m.starts_with("cpu: backend created")
                                            && m.contains(&settings)), "{seen:?}");
        assert!(seen.iter().all(|(level, _)| *level <= LogLevel::Info), "{seen:?}");
    }

    // At DEBUG the cache's sizes come too; the closure just replaced is dropped.
    let debug: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&debug);
    set_log_callback(Some(Box::new(move |level: LogLevel, message: &str| {
        if thread::current().id() == me && level == LogLevel::Debug {
            sink.lock().unwrap().push(message.to_string());
        }
    })), LogLevel::Debug).unwrap();
    assert_eq!(Arc::strong_count(&seen), 1, "the replaced closure is still alive");
    drop(cache);
    assert!(debug.lock().unwrap().iter().any(|m| m.contains("cache destroyed")), "{debug:?}");

    // Replacing the callback from inside it is refused (and does not deadlock); a panic in it
    // stays there, and the call being logged reports its own error as usual.
    let inner: Arc<Mutex<Option<pagedattn::Result<()>>>> = Arc::default();
    let sink = Arc::clone(&inner);
    set_log_callback(Some(Box::new(move |_: LogLevel, _: &str| {
        if thread::current().id() == me {
            *sink.lock().unwrap() = Some(set_log_callback(None, LogLevel::Error));
            panic!("a panic in the log callback (expected by the test)");
        }
    })), LogLevel::Error).unwrap();
    assert_eq!(Backend::new("no-such-backend").unwrap_err().status, Status::UnknownBackend);
    let refused = inner.lock().unwrap().take().expect("the callback ran");
    assert_eq!(refused.unwrap_err().status, Status::InvalidArgument);

    // Removed: nothing more arrives and the last closure is dropped.
    set_log_callback(None, LogLevel::Error).unwrap();
    assert_eq!(Arc::strong_count(&inner), 1);
    let before = debug.lock().unwrap().len();
    let _ = Backend::new("no-such-backend");
    let _ = KvCache::new(&backend, &desc()).unwrap();
    assert_eq!(debug.lock().unwrap().len(), before);
    assert!(inner.lock().unwrap().is_none());
}

#[test]
fn replaced_log_callbacks_are_never_called_again() {
    let _serial = LOG_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    // Each closure checks that it is still allowed; it is disallowed right after its
    // replacement is set, when the library promises never to call it again.
    const CLOSURES: usize = 40;
    let allowed: Arc<Vec<AtomicBool>> = Arc::new((0..CLOSURES).map(|_| AtomicBool::new(false)).collect());
    let calls: Arc<Vec<AtomicUsize>> = Arc::new((0..CLOSURES).map(|_| AtomicUsize::new(0)).collect());
    let violations = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let loggers: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = Backend::new("no-such-backend");
                }
            })
        })
        .collect();
    for i in 0..CLOSURES {
        allowed[i].store(true, Ordering::SeqCst);
        let (allowed_c, calls_c, violations_c) = (Arc::clone(&allowed), Arc::clone(&calls), Arc::clone(&violations));
        set_log_callback(Some(Box::new(move |_: LogLevel, _: &str| {
            calls_c[i].fetch_add(1, Ordering::SeqCst);
            if !allowed_c[i].load(Ordering::SeqCst) {
                violations_c.fetch_add(1, Ordering::SeqCst);
            }
        })), LogLevel::Error).unwrap();
        if i > 0 {
            allowed[i - 1].store(false, Ordering::SeqCst);
        }
        // Replace each closure only once it has run, so that replacements meet calls in flight.
        let deadline = Instant::now() + Duration::from_secs(30);
        while calls[i].load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "closure {i} never ran");
            thread::yield_now();
        }
    }
    set_log_callback(None, LogLevel::Error).unwrap();
    allowed[CLOSURES - 1].store(false, Ordering::SeqCst);
    stop.store(true, Ordering::Relaxed);
    for t in loggers {
        t.join().unwrap();
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "replaced closures were called afterwards");
    // Every closure was dropped once replaced: only this test holds the counters now.
    assert_eq!(Arc::strong_count(&calls), 1);
    assert_eq!(Arc::strong_count(&allowed), 1);
}

#[test]
fn log_levels_map_to_c_and_order_by_verbosity() {
    for level in [LogLevel::Error, LogLevel::Info, LogLevel::Debug] {
        assert_eq!(LogLevel::from_raw(level.raw()), Some(level));
    }
    assert_eq!(LogLevel::from_raw(3), None);
    assert!(LogLevel::Error < LogLevel::Info && LogLevel::Info < LogLevel::Debug);
    assert_eq!(LogLevel::Info.to_string(), "INFO");
}
