//! Running one plugin's WebAssembly: the engine all plugins share (with a ticker that
//! moves its epoch every millisecond, so a deadline is a number of ticks), a pool of
//! instances per plugin, and one call of a hook with its input written into the
//! instance's memory and its answer read back through the host functions.
//!
//! The ABI (`canopy:plugin@1`, documented in the README): the module exports
//! `memory`, `canopy_alloc(len) -> ptr` and `on_publish(ptr, subject_len,
//! headers_len, payload_len) -> verdict` and/or `on_deliver(ptr, subject_len,
//! headers_len, payload_len, reader_len) -> verdict`, with the subject, the NATS
//! header block (maybe empty), the payload and (on deliver) the reader's user name
//! (empty for an anonymous one) laid one after another at `ptr`.
//! A verdict is 0 pass, 1 drop, 2 reject (the reason given to `canopy.reject`), 3
//! replace by what it gave to `canopy.emit` (at most [`MAX_EMITTED`] messages; none
//! is a drop). Host functions (module `canopy`): `emit(subject_ptr, subject_len,
//! headers_ptr, headers_len, payload_ptr, payload_len) -> i32` (0, or -1 when refused),
//! `reject(ptr, len)`, `log(level, ptr, len)`; `env.abort` (AssemblyScript's) traps.
//!
//! Must never: let a call run past its deadline or its memory past its limit, reuse
//! an instance that faulted, give a plugin anything but its input (no clock, network
//! or disk), or panic on what a module does.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime::{
    Caller, Config, Engine, Extern, Instance, InstancePre, Linker, Memory, Module, Store,
    StoreLimits, StoreLimitsBuilder, Trap, TypedFunc,
};

use super::{Emitted, Fault, Hook, Verdict};

/// Messages one call may emit.
pub const MAX_EMITTED: usize = 8;
/// How often the engine's epoch moves: a deadline's unit.
const TICK: Duration = Duration::from_millis(1);
/// Instances one plugin has at most, idle or running: past them a call is not made
/// (answered per the plugin's `on_error`), so a plugin's memory is at most this many
/// times its limit.
pub const MAX_INSTANCES: usize = 4;
/// The longest subject an emitted message may have.
const MAX_SUBJECT: usize = 1024;
/// Log lines one call may write.
const MAX_LOG_LINES: u32 = 8;
/// Bytes of a reason or a log line taken (the rest is cut).
const MAX_TEXT: usize = 1024;

/// The engine every plugin runs on, with its epoch ticker.
fn engine() -> Result<&'static Engine, Fault> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    let made = ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| e.to_string())?;
        let ticking = engine.clone();
        std::thread::Builder::new()
            .name("canopy-plugin-epoch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    ticking.increment_epoch();
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(engine)
    });
    made.as_ref()
        .map_err(|e| Fault::Module(format!("the plugin engine did not start: {e}")))
}

/// What one call's host functions see and gather.
struct HostState {
    limits: StoreLimits,
    emitted: Vec<Emitted>,
    reason: Option<String>,
    /// Bytes an emitted message may have (headers and payload), and all of them.
    max_message: usize,
    emitted_bytes: usize,
    logged: u32,
    plugin: Arc<str>,
    /// The schema binding of the subject of the call, for `schema`.
    schema: Option<Arc<crate::schemas::Binding>>,
}

/// `on_publish`: `(ptr, subject_len, headers_len, payload_len) -> verdict`.
type PublishFunc = TypedFunc<(i32, i32, i32, i32), i32>;
/// `on_deliver`: `(ptr, subject_len, headers_len, payload_len, reader_len) -> verdict`.
type DeliverFunc = TypedFunc<(i32, i32, i32, i32, i32), i32>;

/// One instance, ready for calls.
struct Loaded {
    store: Store<HostState>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    publish: Option<PublishFunc>,
    deliver: Option<DeliverFunc>,
}

/// A compiled plugin and its idle instances.
pub struct Runtime {
    pre: InstancePre<HostState>,
    name: Arc<str>,
    memory_bytes: usize,
    deadline_ticks: u64,
    max_message: usize,
    idle: Mutex<Vec<Loaded>>,
    /// Instances made and not dropped (idle or running).
    live: std::sync::atomic::AtomicUsize,
    /// The hooks the module exports.
    exports: [bool; 2],
}

fn hook_index(hook: Hook) -> usize {
    match hook {
        Hook::Publish => 0,
        Hook::Deliver => 1,
    }
}

fn export_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Publish => "on_publish",
        Hook::Deliver => "on_deliver",
    }
}

impl Runtime {
    /// Compiles `module` (WebAssembly, binary or text) and makes one instance of it,
    /// so a module that cannot run here is refused when it is put, not when a
    /// message comes.
    pub fn new(
        name: &str,
        module: &[u8],
        memory_bytes: usize,
        deadline: Duration,
        max_message: usize,
    ) -> Result<Runtime, Fault> {
        let engine = engine()?;
        let module = Module::new(engine, module)
            .map_err(|e| Fault::Module(format!("not a WebAssembly module: {e:#}")))?;
        let mut linker = Linker::new(engine);
        define_host(&mut linker).map_err(|e| Fault::Module(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| Fault::Module(format!("its imports: {e:#}")))?;
        let exports = [Hook::Publish, Hook::Deliver].map(|hook| {
            module
                .exports()
                .any(|export| export.name() == export_name(hook))
        });
        if !exports.iter().any(|e| *e) {
            return Err(Fault::Module(
                "it exports neither on_publish nor on_deliver".into(),
            ));
        }
        // The epoch moves every tick, whenever the call started: one more tick so a
        // call always has its whole deadline.
        let ticks = deadline.as_millis().max(1) + 1;
        let runtime = Runtime {
            pre,
            name: Arc::from(name),
            memory_bytes,
            deadline_ticks: u64::try_from(ticks).unwrap_or(u64::MAX),
            max_message,
            idle: Mutex::new(Vec::new()),
            live: std::sync::atomic::AtomicUsize::new(0),
            exports,
        };
        let first = runtime.instantiate()?;
        runtime.idle.lock().push(first);
        runtime.live.store(1, std::sync::atomic::Ordering::Relaxed);
        Ok(runtime)
    }

    /// Whether the module exports `hook`.
    pub fn exports(&self, hook: Hook) -> bool {
        self.exports[hook_index(hook)]
    }

    fn instantiate(&self) -> Result<Loaded, Fault> {
        let engine = self.pre.module().engine();
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.memory_bytes)
            .instances(1)
            .tables(4)
            .table_elements(100_000)
            .memories(1)
            .build();
        let mut store = Store::new(
            engine,
            HostState {
                limits,
                emitted: Vec::new(),
                reason: None,
                max_message: self.max_message,
                emitted_bytes: 0,
                logged: 0,
                plugin: Arc::clone(&self.name),
                schema: None,
            },
        );
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(self.deadline_ticks);
        let instance: Instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| fault_of(&e, "starting it"))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| Fault::Module("it exports no memory".into()))?;
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "canopy_alloc")
            .map_err(|e| Fault::Module(format!("canopy_alloc(i32) -> i32: {e:#}")))?;
        let publish = match self.exports(Hook::Publish) {
            true => Some(
                instance
                    .get_typed_func::<(i32, i32, i32, i32), i32>(&mut store, "on_publish")
                    .map_err(|e| {
                        Fault::Module(format!("on_publish(i32, i32, i32, i32) -> i32: {e:#}"))
                    })?,
            ),
            false => None,
        };
        let deliver = match self.exports(Hook::Deliver) {
            true => Some(
                instance
                    .get_typed_func::<(i32, i32, i32, i32, i32), i32>(&mut store, "on_deliver")
                    .map_err(|e| {
                        Fault::Module(format!("on_deliver(i32, i32, i32, i32, i32) -> i32: {e:#}"))
                    })?,
            ),
            false => None,
        };
        Ok(Loaded {
            store,
            memory,
            alloc,
            publish,
            deliver,
        })
    }

    /// Runs `hook` on one message (for `reader`, on deliver). An instance that
    /// faulted is dropped.
    pub fn call(
        &self,
        hook: Hook,
        (subject, headers, payload): (&str, &[u8], &[u8]),
        reader: &str,
        schema: Option<Arc<crate::schemas::Binding>>,
    ) -> Result<Verdict, Fault> {
        use std::sync::atomic::Ordering::Relaxed;
        let taken = self.idle.lock().pop();
        let mut loaded = match taken {
            Some(loaded) => loaded,
            None => {
                let made = self.live.fetch_update(Relaxed, Relaxed, |live| {
                    (live < MAX_INSTANCES).then_some(live + 1)
                });
                if made.is_err() {
                    return Err(Fault::Busy);
                }
                match self.instantiate() {
                    Ok(loaded) => loaded,
                    Err(fault) => {
                        self.live.fetch_sub(1, Relaxed);
                        return Err(fault);
                    }
                }
            }
        };
        loaded.store.data_mut().schema = schema;
        let ran = self.run(&mut loaded, hook, (subject, headers, payload), reader);
        loaded.store.data_mut().schema = None;
        match ran {
            Ok(verdict) => {
                self.idle.lock().push(loaded);
                Ok(verdict)
            }
            Err(fault) => {
                // Never reused: its state may be anything.
                self.live.fetch_sub(1, Relaxed);
                Err(fault)
            }
        }
    }

    fn run(
        &self,
        loaded: &mut Loaded,
        hook: Hook,
        (subject, headers, payload): (&str, &[u8], &[u8]),
        reader: &str,
    ) -> Result<Verdict, Fault> {
        let (publish, deliver) = (loaded.publish.clone(), loaded.deliver.clone());
        let reader = match hook {
            Hook::Publish if publish.is_some() => "",
            Hook::Deliver if deliver.is_some() => reader,
            _ => return Ok(Verdict::Pass),
        };
        let store = &mut loaded.store;
        let state = store.data_mut();
        state.emitted.clear();
        state.reason = None;
        state.emitted_bytes = 0;
        state.logged = 0;
        store.set_epoch_deadline(self.deadline_ticks);
        let parts = [subject.as_bytes(), headers, payload, reader.as_bytes()];
        let total: usize = parts.iter().map(|part| part.len()).sum();
        let length =
            i32::try_from(total).map_err(|_| Fault::Abi("the message is too large".into()))?;
        let ptr = loaded
            .alloc
            .call(&mut *store, length)
            .map_err(|e| fault_of(&e, "canopy_alloc"))?;
        let start =
            usize::try_from(ptr).map_err(|_| Fault::Abi(format!("canopy_alloc gave {ptr}")))?;
        let memory = loaded.memory.data_mut(&mut *store);
        let Some(mut room) = memory.get_mut(start..start.saturating_add(total)) else {
            return Err(Fault::Abi(format!(
                "canopy_alloc gave {ptr}, outside its memory for {total} bytes"
            )));
        };
        for part in parts {
            let (here, rest) = room.split_at_mut(part.len());
            here.copy_from_slice(part);
            room = rest;
        }
        let length = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let (sl, hl, pl) = (
            length(subject.len()),
            length(headers.len()),
            length(payload.len()),
        );
        let called = match (publish, deliver) {
            (Some(func), _) if hook == Hook::Publish => func.call(&mut *store, (ptr, sl, hl, pl)),
            (_, Some(func)) => func.call(&mut *store, (ptr, sl, hl, pl, length(reader.len()))),
            _ => return Ok(Verdict::Pass),
        };
        let code = called.map_err(|e| fault_of(&e, export_name(hook)))?;
        let state = store.data_mut();
        match code {
            0 => Ok(Verdict::Pass),
            1 => Ok(Verdict::Drop),
            2 => {
                Ok(Verdict::Reject(state.reason.take().unwrap_or_else(|| {
                    format!("refused by plugin {}", self.name)
                })))
            }
            3 => Ok(Verdict::Replace(std::mem::take(&mut state.emitted))),
            other => Err(Fault::Abi(format!(
                "{} answered {other}, not a verdict (0-3)",
                export_name(hook)
            ))),
        }
    }
}

/// What a call's error says: its deadline passed, it trapped, or it ran out of room.
fn fault_of(error: &wasmtime::Error, during: &str) -> Fault {
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Fault::Deadline,
        Some(trap) => Fault::Trap(format!("{during}: {trap}")),
        None => Fault::Trap(format!("{during}: {error:#}")),
    }
}

/// Bytes `len` long at `ptr` in the caller's memory, if they are there and `len` is at
/// most `max` (checked before anything is copied).
fn read(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32, max: usize) -> Option<Vec<u8>> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return None;
    };
    let start = usize::try_from(ptr).ok()?;
    let len = usize::try_from(len).ok().filter(|len| *len <= max)?;
    memory
        .data(&*caller)
        .get(start..start.checked_add(len)?)
        .map(<[u8]>::to_vec)
}

fn text(bytes: Option<Vec<u8>>) -> String {
    let mut text = String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned();
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn define_host(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "canopy",
        "emit",
        |mut caller: Caller<'_, HostState>,
         subject_ptr: i32,
         subject_len: i32,
         headers_ptr: i32,
         headers_len: i32,
         payload_ptr: i32,
         payload_len: i32|
         -> i32 {
            let state = caller.data();
            let room = state.max_message;
            if state.emitted.len() >= MAX_EMITTED {
                return -1;
            }
            let (Some(s), Some(h), Some(p)) = (
                read(&mut caller, subject_ptr, subject_len, MAX_SUBJECT),
                read(&mut caller, headers_ptr, headers_len, room),
                read(&mut caller, payload_ptr, payload_len, room),
            ) else {
                return -1;
            };
            let state = caller.data_mut();
            let size = h.len() + p.len();
            let Ok(subject) = String::from_utf8(s) else {
                return -1;
            };
            if state.emitted.len() >= MAX_EMITTED
                || size > state.max_message
                || state.emitted_bytes + size > state.max_message * MAX_EMITTED
            {
                return -1;
            }
            state.emitted_bytes += size;
            state.emitted.push(Emitted {
                subject,
                headers: Bytes::from(h),
                payload: Bytes::from(p),
            });
            0
        },
    )?;
    linker.func_wrap(
        "canopy",
        "reject",
        |mut caller: Caller<'_, HostState>, ptr: i32, len: i32| {
            let reason = text(read(&mut caller, ptr, len, MAX_TEXT));
            caller.data_mut().reason = Some(reason);
        },
    )?;
    linker.func_wrap(
        "canopy",
        "log",
        |mut caller: Caller<'_, HostState>, level: i32, ptr: i32, len: i32| {
            let state = caller.data_mut();
            state.logged += 1;
            if state.logged > MAX_LOG_LINES {
                return;
            }
            let plugin = Arc::clone(&state.plugin);
            // One line whatever it holds: it cannot forge other log lines.
            let line: String = text(read(&mut caller, ptr, len, MAX_TEXT))
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            match level {
                0 => tracing::debug!(%plugin, "{line}"),
                1 => tracing::info!(%plugin, "{line}"),
                _ => tracing::warn!(%plugin, "{line}"),
            }
        },
    )?;
    // The JSON Schema bound to the subject of the call: its length (0: none), copied
    // to `ptr` only when it fits in `len`; -1 when `ptr` is outside the memory.
    linker.func_wrap(
        "canopy",
        "schema",
        |mut caller: Caller<'_, HostState>, ptr: i32, len: i32| -> i32 {
            let Some(text) = caller
                .data()
                .schema
                .as_ref()
                .and_then(|binding| binding.stored.schema.as_ref())
                .map(|schema| schema.to_string())
            else {
                return 0;
            };
            let size = i32::try_from(text.len()).unwrap_or(i32::MAX);
            if size > len {
                return size;
            }
            let memory = caller.get_export("memory").and_then(Extern::into_memory);
            let (Some(memory), Ok(start)) = (memory, usize::try_from(ptr)) else {
                return -1;
            };
            match memory
                .data_mut(&mut caller)
                .get_mut(start..start.saturating_add(text.len()))
            {
                Some(room) => {
                    room.copy_from_slice(text.as_bytes());
                    size
                }
                None => -1,
            }
        },
    )?;
    // AssemblyScript's runtime calls this on an assertion or an allocation failure.
    linker.func_wrap(
        "env",
        "abort",
        |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::msg("the plugin aborted"))
        },
    )?;
    Ok(())
}
