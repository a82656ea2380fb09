//! Finds libpagedattn and its headers, then runs bindgen over the public umbrella header.
//!
//! Search order: PAGEDATTN_LIB_DIR (or the directory of PAGEDATTN_LIBRARY) with
//! PAGEDATTN_INCLUDE_DIRS (colon-separated; derived from a Meson build tree when unset), then
//! pkg-config's `pagedattn` module.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Found {
    lib_dirs: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
}

fn split_paths(value: &str) -> Vec<PathBuf> {
    value.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect()
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
        Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => match env::var("PAGEDATTN_LIBRARY") {
            Ok(file) if !file.is_empty() => Path::new(&file).parent()?.to_path_buf(),
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
