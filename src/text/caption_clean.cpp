// Caption cleaning (see caption_clean.h): UTF-8 checks, HTML unescaping, whitespace folding.
#include "text/caption_clean.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace vidit::text {
namespace {

#include "text/html_entities.inc"

// Length of the UTF-8 sequence starting at s[i] and its code point; 0 when malformed.
size_t decode_utf8(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  uint32_t c, min;
  if ((b0 & 0xE0) == 0xC0) len = 2, c = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, c = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) len = 4, c = b0 & 0x07, min = 0x10000;
  else return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return len;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Python's str.isspace() (the same set as the regex \s on str).
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

const char* find_named(std::string_view name) {
  const auto* end = kNamedRefs + sizeof(kNamedRefs) / sizeof(kNamedRefs[0]);
  const auto* it = std::lower_bound(kNamedRefs, end, name,
                                    [](const NamedRef& r, std::string_view n) { return std::string_view(r.name) < n; });
  return it != end && std::string_view(it->name) == name ? it->utf8 : nullptr;
}

// The text a numeric reference to `code` stands for (HTML5's rules, as Python applies them).
void append_numeric(std::string& out, uint32_t code) {
  for (const auto& r : kRemappedNumeric)
    if (r.code == code) {
      out += r.utf8;
      return;
    }
  if ((code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
    append_utf8(out, 0xFFFD);
    return;
  }
  const auto* end = kDroppedCodePoints + sizeof(kDroppedCodePoints) / sizeof(kDroppedCodePoints[0]);
  if (std::binary_search(kDroppedCodePoints, end, code)) return;
  append_utf8(out, code);
}

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Tries to read a reference at s[i] == '&'; appends its text and returns the bytes consumed, or
// 0 when nothing there is a reference (the '&' is then literal).
size_t unescape_at(std::string_view s, size_t i, std::string& out) {
  size_t j = i + 1;
  if (j < s.size() && s[j] == '#') {
    ++j;
    bool hex = false;
    if (j < s.size() && is_digit(s[j])) {
    } else if (j + 1 < s.size() && (s[j] == 'x' || s[j] == 'X') && is_hex(s[j + 1])) {
      hex = true;
      ++j;
    } else {
      return 0;
    }
    uint32_t code = 0;  // saturates past U+10FFFF: any larger number means the same (U+FFFD)
    while (j < s.size() && (hex ? is_hex(s[j]) : is_digit(s[j]))) {
      const char c = s[j++];
      const uint32_t d = is_digit(c) ? c - '0' : (std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
      code = std::min<uint32_t>(code * (hex ? 16 : 10) + d, 0x110000);
    }
    if (j < s.size() && s[j] == ';') ++j;
    append_numeric(out, code);
    return j - i;
  }
  // A name: 1 to 32 code points other than \t \n \f space < & # ;, then an optional ';'.
  size_t chars = 0;
  while (j < s.size() && chars < 32) {
    const char c = s[j];
    if (c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' || c == '#' || c == ';') break;
    uint32_t cp;
    const size_t len = decode_utf8(s, j, &cp);
    j += len ? len : 1;
    ++chars;
  }
  if (chars == 0) return 0;
  if (j < s.size() && s[j] == ';') ++j;
  const std::string_view name = s.substr(i + 1, j - i - 1);
  if (const char* v = find_named(name)) {
    out += v;
    return j - i;
  }
  // The longest prefix of at least two characters that is a name (names are ASCII, so byte
  // prefixes stand for character prefixes here).
  for (size_t x = name.size() - 1; x >= 2; --x) {
    if (const char* v = find_named(name.substr(0, x))) {
      out += v;
      out += name.substr(x);
      return j - i;
    }
  }
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s, size_t* bad_offset) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t len = decode_utf8(s, i, &cp);
    if (len == 0) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

std::string html_unescape(std::string_view s) {
  if (s.find('&') == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '&') {
      const size_t used = unescape_at(s, i, out);
      if (used) {
        i += used;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

std::string clean_caption(std::string_view s) {
  const std::string once = html_unescape(s);
  const std::string text = html_unescape(once);
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    size_t len = decode_utf8(text, i, &cp);
    if (len == 0) cp = 0xFFFD, len = 1;  // cannot happen on valid input
    if (is_space(cp)) {
      pending_space = !out.empty();
    } else {
      if (pending_space) out += ' ';
      pending_space = false;
      out.append(text, i, len);
    }
    i += len;
  }
  return out;
}

std::string caption_excerpt(std::string_view s, size_t max_chars) {
  std::string out;
  size_t chars = 0, i = 0;
  for (; i < s.size() && chars < max_chars; ++chars) {
    uint32_t cp;
    const size_t len = decode_utf8(s, i, &cp);
    if (len == 0 || cp < 0x20 || cp == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(s[i]));
      out += buf;
      i += 1;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  if (i < s.size()) out += "...";
  return out;
}

}  // namespace vidit::text
