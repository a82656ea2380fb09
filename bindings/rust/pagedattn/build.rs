//! Lets this crate's tests and examples find libpagedattn at run time without LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_PAGEDATTN_LIB_DIR");
    if let Ok(dirs) = std::env::var("DEP_PAGEDATTN_LIB_DIR") {
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
