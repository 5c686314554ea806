//! With the `isal` feature: compiles the small C face of ISA-L (csrc/isal_gzip.c) and links the
//! system libisal, found with pkg-config (Debian: `libisal-dev`).

fn main() {
    println!("cargo:rerun-if-changed=csrc/isal_gzip.c");
    #[cfg(feature = "isal")]
    {
        let library = pkg_config::Config::new()
            .atleast_version("2.25")
            .probe("libisal")
            .unwrap_or_else(|error| {
                panic!(
                    "the `isal` feature of rpull-decompress needs ISA-L's headers and library \
                     (Debian/Ubuntu: apt-get install libisal-dev; Fedora: dnf install isa-l-devel); \
                     build without it with --no-default-features: {error}"
                )
            });
        let mut build = cc::Build::new();
        build.file("csrc/isal_gzip.c").warnings(true).opt_level(2);
        for include in &library.include_paths {
            build.include(include);
        }
        build.compile("rpull_isal_gzip");
    }
}
