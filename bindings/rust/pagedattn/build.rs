//! Lets this crate's tests and examples find libpagedattn at run time without LD_LIBRARY_PATH,
//! and tells the tests where the library (and so its Meson build tree) is.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_PAGEDATTN_LIB_DIR");
    let dirs = std::env::var("DEP_PAGEDATTN_LIB_DIR").unwrap_or_default();
    for dir in dirs.split(':').filter(|d| !d.is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    println!("cargo:rustc-env=PAGEDATTN_BUILD_LIB_DIR={}", dirs.split(':').next().unwrap_or(""));
}
