# Source this file for `rust_html FILE BYTES`: writes the first BYTES bytes of the HTML of
# four books shipped with the Rust toolchain (the book, the reference, the nomicon, the
# cargo book), in path order, to FILE, unless FILE already holds that many; a corpus of
# markup and English like enwik8's, the same bytes for the same toolchain. Fails with a
# message when the docs are not installed.
rust_html() { # FILE BYTES
    local file=$1 bytes=$2 doc
    [ -f "$file" ] && [ "$(stat -c %s "$file")" -eq "$bytes" ] && return 0
    doc="$(rustc --print sysroot)/share/doc/rust/html"
    # `head` closes the pipe once it has enough: cat's SIGPIPE is not a failure.
    (set +o pipefail; find "$doc/book" "$doc/reference" "$doc/nomicon" "$doc/cargo" -name '*.html' | LC_ALL=C sort | xargs cat 2>/dev/null | head -c "$bytes" > "$file")
    [ "$(stat -c %s "$file")" -eq "$bytes" ] || { rm -f "$file"; echo "$0: the Rust toolchain's HTML docs ($doc) are missing; set CORPUS=FILE" >&2; return 1; }
}
