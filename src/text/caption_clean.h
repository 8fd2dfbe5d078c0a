// Caption cleaning before tokenization, as Wan and diffusers' WanPipeline do it (their
// `prompt_clean`): HTML character references unescaped twice, surrounding whitespace stripped,
// every run of whitespace collapsed to one space. Whitespace is what Python's str.isspace() and
// the regex \s call whitespace (ASCII blanks, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
// U+2029, U+202F, U+205F, U+3000, U+001C-U+001F). The Python version also runs ftfy.fix_text
// (mojibake repair) first; ftfy has no C++ equivalent and is skipped here, so a caption that
// ftfy would change (mojibake, some quotes, ...) may tokenize differently from Wan's Python.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace vidit::text {

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). On false, *bad_offset (when given) is the byte offset of the first bad sequence.
bool is_valid_utf8(std::string_view s, size_t* bad_offset = nullptr);

// Python's html.unescape on UTF-8 text: named (HTML5 list, with the legacy names that need no
// ";"), decimal and hexadecimal references, with the spec's replacements for invalid numbers.
// Precondition: `s` is valid UTF-8.
std::string html_unescape(std::string_view s);

// Wan's prompt_clean without ftfy (see above). Precondition: `s` is valid UTF-8.
std::string clean_caption(std::string_view s);

// A caption for error messages: its first `max_chars` code points, control characters and
// invalid bytes escaped (\xNN), "..." when cut.
std::string caption_excerpt(std::string_view s, size_t max_chars = 40);

}  // namespace vidit::text
