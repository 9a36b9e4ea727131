// The GPT-2 byte-to-unicode map that ByteLevel pre-tokenizers and decoders share: every byte gets
// a printable character (printable Latin-1 bytes map to themselves, the rest to U+0100 onwards).
#ifndef CARPOOL_TEXT_BYTE_LEVEL_H_
#define CARPOOL_TEXT_BYTE_LEVEL_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace carpool::text {

// The UTF-8 of the character standing for byte `b`.
const std::string& ByteToChars(uint8_t b);
// The byte `c` stands for, or -1 when `c` is not in the map.
int CharToByte(char32_t c);
// GPT-2's split regex, used by ByteLevel with use_regex.
inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_BYTE_LEVEL_H_
