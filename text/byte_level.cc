#include "text/byte_level.h"

#include <array>

#include "text/unicode.h"

namespace carpool::text {
namespace {

struct ByteMap {
  std::array<std::string, 256> chars;
  std::array<int, 324> bytes;  // every mapped character is below U+0144
  ByteMap() {
    bytes.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int c = printable ? b : next++;
      AppendUtf8(static_cast<char32_t>(c), &chars[b]);
      bytes[c] = b;
    }
  }
};

const ByteMap& Map() {
  static const ByteMap* map = new ByteMap();
  return *map;
}

}  // namespace

const std::string& ByteToChars(uint8_t b) { return Map().chars[b]; }

int CharToByte(char32_t c) { return c < Map().bytes.size() ? Map().bytes[c] : -1; }

}  // namespace carpool::text
