"""No AES or GHASH of libcomm's own: the library takes every cipher byte from OpenSSL or ipsec-mb
(libcomm/base/tls/gcm.h). Fails on any AES or carry-less-multiply intrinsic, builtin or instruction
under libcomm/, transports/ or topology/; --self-test shows it catches one planted in a copy."""
import os
import re
import shutil
import sys
import tempfile

PATTERN = re.compile(r"_mm(256|512)?_(mask_|maskz_)?(aes\w*|clmulepi64\w*)|__builtin_ia32_(v?aes\w*|v?pclmul\w*)"
                     r"|\b(v?aesenc(last)?|v?aesdec(last)?|v?pclmulqdq)\b|#\s*include\s*<wmmintrin\.h>")
FOLDERS = ("libcomm", "transports", "topology")


def offenders(root):
    found = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if not name.endswith((".c", ".cc", ".cpp", ".h", ".hpp", ".S", ".s", ".asm")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        if PATTERN.search(line):
                            found.append(f"{os.path.relpath(path, root)}:{n}: {line.strip()}")
    return found


def main():
    self_test = "--self-test" in sys.argv
    root = [a for a in sys.argv[1:] if a != "--self-test"][0]
    if self_test:
        with tempfile.TemporaryDirectory() as tmp:
            for folder in FOLDERS:
                shutil.copytree(os.path.join(root, folder), os.path.join(tmp, folder))
            with open(os.path.join(tmp, "libcomm", "base", "planted.cc"), "w") as f:
                f.write("__m128i r = _mm_aesenc_si128(a, b);\n")
            if not offenders(tmp):
                print("self-test: a planted _mm_aesenc_si128 was not found")
                return 1
        print("self-test: the planted intrinsic was found")
        return 0
    found = offenders(root)
    for line in found:
        print("own crypto (take it from OpenSSL or ipsec-mb, libcomm/base/tls/gcm.h):", line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
