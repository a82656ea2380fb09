//! Tells cargo how to link libpagedattn; with the `bindgen` feature, also regenerates the
//! bindings from the C headers (otherwise the checked-in `src/bindings.rs` is used).
//!
//! By default the program links libpagedattn.so; with the `static` feature it links
//! libpagedattn.a (core and cpu backend; the plugins are still loaded at run time) and the
//! libraries the archive needs (`STATIC_DEPS`, or what `pagedattn-static.pc` lists), so it starts
//! without a run path or `LD_LIBRARY_PATH`.
//!
//! Where the library is looked for, first hit wins:
//! 1. `PAGEDATTN_LIB_DIR` (the directory holding libpagedattn.so, or libpagedattn.a with
//!    `static`) or `PAGEDATTN_LIBRARY` (the file itself; with `static`, the archive). A relative
//!    path is tried against the directory `cargo` was run from (`$PWD`), the workspace
//!    (`bindings/rust`) and this package, since cargo runs this script in the package's own
//!    directory.
//! 2. `pkg-config pagedattn` (with `static`, `pkg-config pagedattn-static`), through the
//!    `pkg-config` crate (so `PKG_CONFIG_PATH` applies; a Meson build tree's `meson-uninstalled/`
//!    directory works too).
//!
//! Not finding the library is not an error: the script warns and still asks for `-lpagedattn`,
//! so `cargo doc` and `cargo check` work without it and a real link fails naming the library.
//! Under docs.rs (`DOCS_RS` set) nothing is probed.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// What the search found: library directories and (when known) header directories.
struct Found {
    lib_dirs: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
}

/// What libpagedattn.a needs besides itself, in link order, as `pagedattn-static.pc` lists it:
/// Highway (run-time target detection), the C++ runtime, libm, dl (the plugin loader), threads.
const STATIC_DEPS: &[&str] = &["hwy", "stdc++", "m", "dl", "pthread"];

/// Whether the `static` feature asks for libpagedattn.a.
fn want_static() -> bool {
    env::var_os("CARGO_FEATURE_STATIC").is_some()
}

fn has_library(dir: &Path) -> bool {
    let names: &[&str] = if want_static() {
        &["libpagedattn.a"]
    } else {
        &["libpagedattn.so", "libpagedattn.so.0", "libpagedattn.dylib", "pagedattn.lib"]
    };
    names.iter().any(|name| dir.join(name).exists())
}

/// Prints the link lines: the library (the archive with `static`, then its dependencies, which
/// must follow it) and, when known, its directory.
fn emit_link(lib_dir: Option<&Path>, static_deps: &[String]) {
    if let Some(dir) = lib_dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    if want_static() {
        println!("cargo:rustc-link-lib=static=pagedattn");
        for dep in static_deps {
            println!("cargo:rustc-link-lib=dylib={dep}");
        }
    } else {
        println!("cargo:rustc-link-lib=dylib=pagedattn");
    }
}

fn default_static_deps() -> Vec<String> {
    STATIC_DEPS.iter().map(|d| d.to_string()).collect()
}

/// Resolves a path from variable `var`: absolute as is; relative against `$PWD`, the workspace
/// and this package, the first for which `ok` holds. Panics when none does: the variable is an
/// explicit request, and building against another library than the one named helps nobody.
fn resolve(var: &str, value: &str, ok: impl Fn(&Path) -> bool) -> PathBuf {
    let path = PathBuf::from(value);
    if path.is_absolute() {
        return path;
    }
    println!("cargo:rerun-if-env-changed=PWD");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let bases = [env::var_os("PWD").map(PathBuf::from), manifest.parent().map(Path::to_path_buf), Some(manifest)];
    let tried: Vec<PathBuf> = bases.into_iter().flatten().map(|b| b.join(&path)).collect();
    match tried.iter().find(|p| ok(p)) {
        Some(hit) => hit.canonicalize().unwrap_or_else(|_| hit.clone()),
        None => panic!(
            "{var}={value}: nothing usable at {}; use an absolute path",
            tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Headers beside a library directory: a Meson build tree keeps the generated version.h in
/// `<build>/include` and the rest in the source tree above this crate; an installed prefix has
/// `<prefix>/include` above `<prefix>/lib[/triplet]`.
fn include_dirs_near(lib_dir: &Path) -> Vec<PathBuf> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut candidates: Vec<PathBuf> = lib_dir.ancestors().skip(1).take(2).map(|p| p.join("include")).collect();
    candidates.push(manifest.join("../../../include"));
    candidates
        .into_iter()
        .filter(|d| d.join("pagedattn/pagedattn.h").exists() || d.join("pagedattn/version.h").exists())
        .collect()
}

/// The library named by `PAGEDATTN_LIB_DIR` / `PAGEDATTN_LIBRARY`, if either is set.
fn from_env() -> Option<Found> {
    let var = |name: &str| env::var(name).ok().filter(|v| !v.is_empty());
    let lib_dir = if let Some(dir) = var("PAGEDATTN_LIB_DIR") {
        resolve("PAGEDATTN_LIB_DIR", &dir, has_library)
    } else {
        let file = resolve("PAGEDATTN_LIBRARY", &var("PAGEDATTN_LIBRARY")?, Path::is_file);
        if want_static() && file.extension() != Some(OsStr::new("a")) {
            panic!("PAGEDATTN_LIBRARY={}: the `static` feature links libpagedattn.a, not this file", file.display());
        }
        file.parent().expect("a file has a parent").to_path_buf()
    };
    let include_dirs = match var("PAGEDATTN_INCLUDE_DIRS") {
        Some(dirs) => dirs.split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect(),
        None => include_dirs_near(&lib_dir),
    };
    emit_link(Some(&lib_dir), &default_static_deps());
    Some(Found { lib_dirs: vec![lib_dir], include_dirs })
}

/// The library as `pkg-config pagedattn` describes it (the crate prints the link lines; a run
/// path in the file's Libs reaches only this package's own targets). With `static`,
/// `pagedattn-static`: its `archive` variable is the path of libpagedattn.a, and its `-l`
/// flags the archive's dependencies.
fn from_pkg_config() -> Result<Found, String> {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if !want_static() {
        let lib = pkg_config::Config::new().probe("pagedattn").map_err(|e| e.to_string())?;
        return Ok(Found { lib_dirs: lib.link_paths, include_dirs: lib.include_paths });
    }
    let lib = pkg_config::Config::new().cargo_metadata(false).probe("pagedattn-static").map_err(|e| e.to_string())?;
    let archive = PathBuf::from(pkg_config::get_variable("pagedattn-static", "archive").map_err(|e| e.to_string())?);
    let lib_dir = archive.parent().map(Path::to_path_buf).unwrap_or_default();
    if archive.file_name() != Some(OsStr::new("libpagedattn.a")) || !archive.is_file() {
        return Err(format!("pagedattn-static.pc names {} as the archive: not an existing libpagedattn.a", archive.display()));
    }
    emit_link(Some(&lib_dir), &lib.libs);
    Ok(Found { lib_dirs: vec![lib_dir], include_dirs: lib.include_paths })
}

#[cfg(feature = "bindgen")]
fn generate(include_dirs: &[PathBuf]) {
    let mut builder = bindgen::Builder::default()
        .header_contents("pagedattn_wrapper.h", "#include <pagedattn/pagedattn.h>\n")
        .allowlist_function("pagedattn_.*")
        .allowlist_type("pagedattn_.*")
        .allowlist_var("PAGEDATTN_.*")
        // C enums become integer constants: a Rust enum would be UB for unknown values.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .size_t_is_usize(true)
        // Layout tests hard-code one target's sizes; the checked-in file must suit every target.
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks));
    for dir in include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!("bindgen failed on pagedattn/pagedattn.h ({e}; include dirs {include_dirs:?}; set PAGEDATTN_INCLUDE_DIRS)")
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo")).join("bindings.rs");
    bindings.write_to_file(out).expect("cannot write bindings.rs");
}

fn main() {
    for var in ["PAGEDATTN_LIB_DIR", "PAGEDATTN_LIBRARY", "PAGEDATTN_INCLUDE_DIRS", "DOCS_RS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if env::var_os("DOCS_RS").is_some() {
        return;
    }
    let found = match from_env().map(Ok).unwrap_or_else(from_pkg_config) {
        Ok(found) => found,
        Err(why) => {
            let (file, pc) = if want_static() {
                ("libpagedattn.a", "pagedattn-static")
            } else {
                ("libpagedattn.so", "pagedattn")
            };
            println!(
                "cargo:warning=libpagedattn not found: set PAGEDATTN_LIB_DIR=<dir with {file}> \
                 or make `pkg-config {pc}` work (PKG_CONFIG_PATH); linking will fail ({})",
                // A cargo warning is one line; pkg-config's own stderr says what it missed.
                why.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
            );
            emit_link(None, &default_static_deps());
            let source = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo")).join("../../../include");
            let include_dirs = env::var("PAGEDATTN_INCLUDE_DIRS")
                .map(|d| d.split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect())
                .unwrap_or_else(|_| vec![source]);
            Found { lib_dirs: Vec::new(), include_dirs }
        }
    };
    // Seen by the build scripts of direct dependents as DEP_PAGEDATTN_LIB_DIR / DEP_PAGEDATTN_INCLUDE.
    let join = |dirs: &[PathBuf]| dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":");
    println!("cargo:lib_dir={}", join(&found.lib_dirs));
    println!("cargo:include={}", join(&found.include_dirs));
    #[cfg(feature = "bindgen")]
    generate(&found.include_dirs);
}
