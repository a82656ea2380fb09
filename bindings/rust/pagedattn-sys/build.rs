//! Finds libpagedattn and its headers, then runs bindgen over the public umbrella header.
//!
//! Search order: PAGEDATTN_LIB_DIR (or the directory of PAGEDATTN_LIBRARY) with
//! PAGEDATTN_INCLUDE_DIRS (colon-separated; derived from a Meson build tree when unset), then
//! pkg-config's `pagedattn` module.
//!
//! Relative paths in those variables: cargo runs this script in the package's own directory and
//! does not say where it was invoked, so a relative path is tried against, in order, the shell's
//! working directory (`$PWD`, where `cargo` was typed), the workspace root (the nearest
//! directory above this package whose Cargo.toml has `[workspace]`, i.e. `bindings/rust`) and
//! this package's directory; the first place where the library (or header) exists wins. So
//! `cd bindings/rust && PAGEDATTN_LIB_DIR=../../build/lib cargo run --example decode` finds the
//! Meson build tree at the top of the repository. Absolute paths are used as they are.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Found {
    lib_dirs: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
}

/// The nearest directory at or above `start` whose Cargo.toml declares `[workspace]`.
fn workspace_root(start: &Path) -> Option<PathBuf> {
    start.ancestors().find_map(|dir| {
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
        text.lines().any(|l| l.trim() == "[workspace]").then(|| dir.to_path_buf())
    })
}

/// Where a relative path from the environment may be meant from, most likely first.
fn bases() -> Vec<PathBuf> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let mut out = Vec::new();
    if let Some(pwd) = env::var_os("PWD").map(PathBuf::from).filter(|p| p.is_absolute()) {
        out.push(pwd);
    }
    if let Some(root) = workspace_root(&manifest) {
        out.push(root);
    }
    out.push(manifest);
    out.dedup();
    out
}

/// Resolves the path `value` of environment variable `var`: absolute as is; relative against
/// [`bases`], taking the first candidate for which `found` holds. Panics, listing the candidates,
/// when none does: a build against the wrong or a missing library helps nobody.
fn resolve(var: &str, value: &str, what: &str, found: impl Fn(&Path) -> bool) -> PathBuf {
    let path = PathBuf::from(value);
    if path.is_absolute() {
        return path;
    }
    // The answer depends on where cargo was run from.
    println!("cargo:rerun-if-env-changed=PWD");
    let candidates: Vec<PathBuf> = bases().iter().map(|b| b.join(&path)).collect();
    match candidates.iter().find(|c| found(c)) {
        Some(hit) => std::fs::canonicalize(hit).unwrap_or_else(|_| hit.clone()),
        None => panic!(
            "{var}={value} is relative and no {what} was found there; tried: {}. \
             Use an absolute path (e.g. {var}=$PWD/{value}).",
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn has_library(dir: &Path) -> bool {
    ["libpagedattn.so", "libpagedattn.so.0", "libpagedattn.dylib", "pagedattn.lib"]
        .iter()
        .any(|name| dir.join(name).exists())
}

fn has_header(dir: &Path) -> bool {
    dir.join("pagedattn").join("pagedattn.h").exists()
        || dir.join("pagedattn").join("version.h").exists()
}

fn split_paths(value: &str) -> Vec<PathBuf> {
    value
        .split(':')
        .filter(|s| !s.is_empty())
        .map(|s| resolve("PAGEDATTN_INCLUDE_DIRS", s, "pagedattn/*.h", has_header))
        .collect()
}

/// A Meson build tree keeps libpagedattn.so in <build>/lib and the generated version.h in
/// <build>/include; the other headers stay in the source tree beside this crate.
fn derived_include_dirs(lib_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(parent) = lib_dir.parent() {
        let generated = parent.join("include");
        if generated.join("pagedattn").join("version.h").exists() {
            dirs.push(generated);
        }
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let source = manifest.join("..").join("..").join("..").join("include");
    if source.join("pagedattn").join("pagedattn.h").exists() {
        dirs.push(source);
    }
    // An installed prefix: <prefix>/lib[/triplet] beside <prefix>/include.
    for up in [lib_dir.parent(), lib_dir.parent().and_then(Path::parent)].into_iter().flatten() {
        let inc = up.join("include");
        if inc.join("pagedattn").join("pagedattn.h").exists() {
            dirs.push(inc);
        }
    }
    dirs
}

fn from_env() -> Option<Found> {
    let lib_dir = match env::var("PAGEDATTN_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => {
            resolve("PAGEDATTN_LIB_DIR", &dir, "libpagedattn", has_library)
        }
        _ => match env::var("PAGEDATTN_LIBRARY") {
            Ok(file) if !file.is_empty() => {
                resolve("PAGEDATTN_LIBRARY", &file, "file", Path::exists).parent()?.to_path_buf()
            }
            _ => return None,
        },
    };
    let include_dirs = match env::var("PAGEDATTN_INCLUDE_DIRS") {
        Ok(dirs) if !dirs.is_empty() => split_paths(&dirs),
        _ => derived_include_dirs(&lib_dir),
    };
    Some(Found { lib_dirs: vec![lib_dir], include_dirs })
}

fn pkg_config(args: &[&str]) -> Result<Vec<String>, String> {
    let out = Command::new(env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into()))
        .args(args)
        .arg("pagedattn")
        .output()
        .map_err(|e| format!("cannot run pkg-config: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect())
}

fn from_pkg_config() -> Result<Found, String> {
    let strip = |flags: Vec<String>, prefix: &str| -> Vec<PathBuf> {
        flags.iter().filter_map(|f| f.strip_prefix(prefix)).map(PathBuf::from).collect()
    };
    let include_dirs = strip(pkg_config(&["--cflags-only-I"])?, "-I");
    let lib_dirs = strip(pkg_config(&["--libs-only-L"])?, "-L");
    Ok(Found { lib_dirs, include_dirs })
}

fn main() {
    for var in ["PAGEDATTN_LIB_DIR", "PAGEDATTN_LIBRARY", "PAGEDATTN_INCLUDE_DIRS",
                "PKG_CONFIG_PATH", "PKG_CONFIG"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let found = match from_env() {
        Some(found) => found,
        None => from_pkg_config().unwrap_or_else(|why| {
            panic!("libpagedattn not found: set PAGEDATTN_LIB_DIR (e.g. <meson build dir>/lib) \
                    or make `pkg-config pagedattn` work ({why})")
        }),
    };
    for dir in &found.lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=pagedattn");
    // Exposed to dependents' build scripts as DEP_PAGEDATTN_LIB_DIR / DEP_PAGEDATTN_INCLUDE.
    let joined = |dirs: &[PathBuf]| {
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
    };
    println!("cargo:lib_dir={}", joined(&found.lib_dirs));
    println!("cargo:include={}", joined(&found.include_dirs));

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
        .parse_callbacks(Box::new(bindgen::CargoCallbacks));
    for dir in &found.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder.generate().expect("bindgen failed on pagedattn/pagedattn.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("cannot write bindings.rs");
}
