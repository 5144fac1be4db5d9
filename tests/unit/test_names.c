/* SHA-256 against FIPS 180-4 vectors, and lock-name → file-name encoding. */
#include <string.h>

#include "backends/file.h"
#include "dlock.h"
#include "core/md5.h"
#include "core/sha256.h"
#include "tests/tap.h"

/* The digest of in by MD5 (md5 set) or SHA-256, in hex, is want. */
static void digest_is(int md5, const char *in, size_t len, const char *want, const char *what)
{
    unsigned char d[DLOCK_SHA256_LEN];
    char hex[2 * DLOCK_SHA256_LEN + 1];
    if (md5)
        dlock_md5(in, len, d);
    else
        dlock_sha256(in, len, d);
    dlock_hex(d, md5 ? DLOCK_MD5_LEN : DLOCK_SHA256_LEN, hex);
    is_str(hex, want, "%s %s", md5 ? "md5" : "sha256", what);
}
#define sha_is(...) digest_is(0, __VA_ARGS__)
#define md5_is(...) digest_is(1, __VA_ARGS__)

static void enc_is(const char *name, size_t len, const char *want)
{
    char out[DLOCK_FILE_ENCODED_MAX + 80];
    is_int(dlock_file_encode_name(name, len, out, sizeof out), 0, "encodes '%s'", want);
    is_str(out, want, "encoding of '%.*s'", (int)len, name);
}

int main(void)
{
    static char million[1000000];
    char big[600], out[DLOCK_FILE_ENCODED_MAX + 80], out2[DLOCK_FILE_ENCODED_MAX + 80];

    sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    sha_is("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
           "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "448-bit");
    memset(million, 'a', sizeof million);
    sha_is(million, sizeof million,
           "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "a x 1e6");

    /* RFC 1321's suite, and the padding's edges (55, 56 and 64 bytes). */
    md5_is("", 0, "d41d8cd98f00b204e9800998ecf8427e", "empty");
    md5_is("abc", 3, "900150983cd24fb0d6963f7d28e17f72", "abc");
    md5_is("12345678901234567890123456789012345678901234567890123456789012345678901234567890",
           80, "57edf4a22be3c955ac49da2e2107b67a", "80 digits");
    md5_is(million, 55, "ef1772b6dff9a122358552954ad0df65", "a x 55");
    md5_is(million, 56, "3b0c8ac703f828b04c6c197006d17218", "a x 56");
    md5_is(million, 64, "014842d480b571495a4a0363793f7367", "a x 64");
    md5_is(million, sizeof million, "7707d6ae4e027c70eea2a935c2296f21", "a x 1e6");

    enc_is("job", 3, "job.lock");
    enc_is("a/b", 3, "a%2Fb.lock");
    enc_is("..", 2, "%2E..lock");
    enc_is(".hidden", 7, "%2Ehidden.lock");
    enc_is("with space", 10, "with%20space.lock");
    enc_is("caf\xc3\xa9", 5, "caf%C3%A9.lock");
    enc_is("x~y%", 4, "x%7Ey%25.lock");
    enc_is("Aa", 2, "Aa.lock");

    memset(big, 'q', sizeof big);
    is_int(dlock_file_encode_name(big, sizeof big, out, sizeof out), 0, "long name encodes");
    ok(strlen(out) < 255, "long name fits one path component (%zu bytes)", strlen(out));
    ok(strchr(out, '~') != NULL, "long name is hashed");
    big[599] = 'r';
    dlock_file_encode_name(big, sizeof big, out2, sizeof out2);
    ok(strcmp(out, out2) != 0, "long names differing in the last byte differ");
    memset(big, '/', 200);
    is_int(dlock_file_encode_name(big, 200, out, sizeof out), 0, "200 slashes encode");
    ok(strlen(out) < 255 && strchr(out, '/') == NULL, "no slash survives, fits");
    is_int(dlock_file_encode_name("abc", 3, out, 4), DLOCK_EINVAL, "too small a buffer");
    return done_testing();
}
