// nopfs._client's JPEG decode, for nopfs.torch.pil_decode: the RGB pixels of a JPEG decoded by
// PIL's own libjpeg with the settings PIL's JPEG plugin uses (no scaling, the default IDCT and
// upsampling, out_color_space RGB; a one-channel image decoded to gray and widened to RGB is what
// Image.convert("RGB") makes of PIL's "L" image), straight from any buffer (a view of the
// stream's ring: no copy), without the GIL (so that decode threads run at once) and without
// PIL's header parsing in Python. A batch's JPEGs that a process reads once (a stream opened
// read_once) are read in pieces as libjpeg asks for them, so that a decode copies the image the
// sample holds and not the whole sample.
//
// The extension links no libjpeg: use_libjpeg_of(path) looks libjpeg's functions up (dlsym)
// among the dependencies of a shared object already loaded, PIL's _imaging module, so the code
// that decodes is the code PIL runs; jpeg_CreateDecompress refuses a library of another ABI
// (its version and struct size), and the decode then gives up. Only what PIL would decode to the
// same pixels is decoded here: 8-bit images of one or three channels that libjpeg reads without
// a warning (a truncated or corrupt file, which PIL handles its own way, is not). Everything else
// returns None and the caller asks PIL itself.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// After <cstdio> and <cstddef>: jpeglib.h uses FILE and size_t without including them.
#include <jpeglib.h>

#include "python/binding.h"

namespace nopfs::python {
namespace {

// The libjpeg functions a decode calls, looked up in the library PIL uses.
struct LibJpeg {
  decltype(&jpeg_std_error) std_error;
  decltype(&jpeg_CreateDecompress) create_decompress;
  decltype(&jpeg_destroy_decompress) destroy_decompress;
  decltype(&jpeg_mem_src) mem_src;
  decltype(&jpeg_read_header) read_header;
  decltype(&jpeg_start_decompress) start_decompress;
  decltype(&jpeg_read_scanlines) read_scanlines;
  decltype(&jpeg_finish_decompress) finish_decompress;
  decltype(&jpeg_resync_to_restart) resync_to_restart;
};

// Set once by use_libjpeg_of (under the GIL), read by decodes (without it); never freed.
std::atomic<const LibJpeg*> g_libjpeg{nullptr};

// libjpeg's functions among the dependencies of the shared object at `path`, which must be loaded
// already (RTLD_NOLOAD: nothing new is loaded, no constructor runs); nullptr if one is missing.
const LibJpeg* LookUp(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  // The handle stays open: the functions must outlive every decode (the object stays loaded).
  auto find = [handle](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    return fn != nullptr;
  };
  auto lib = std::make_unique<LibJpeg>();
  if (!find(lib->std_error, "jpeg_std_error") ||
      !find(lib->create_decompress, "jpeg_CreateDecompress") ||
      !find(lib->destroy_decompress, "jpeg_destroy_decompress") ||
      !find(lib->mem_src, "jpeg_mem_src") || !find(lib->read_header, "jpeg_read_header") ||
      !find(lib->start_decompress, "jpeg_start_decompress") ||
      !find(lib->read_scanlines, "jpeg_read_scanlines") ||
      !find(lib->finish_decompress, "jpeg_finish_decompress") ||
      !find(lib->resync_to_restart, "jpeg_resync_to_restart")) {
    dlclose(handle);
    return nullptr;
  }
  return lib.release();
}

// libjpeg reports an error by calling error_exit, which must not return: it jumps back to the
// setjmp of the call under way. A warning (a corrupt or truncated stream that libjpeg patches up)
// is noted and the decode is given up as well: PIL's answer to such a file is its own.
struct ErrorJump {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool warned = false;
};

extern "C" void JumpOnError(j_common_ptr c) {
  std::longjmp(reinterpret_cast<ErrorJump*>(c->err)->jump, 1);
}

extern "C" void NoteWarning(j_common_ptr c, int level) {
  if (level < 0) reinterpret_cast<ErrorJump*>(c->err)->warned = true;
}

extern "C" void PrintNothing(j_common_ptr) {}

// A JPEG read in pieces (JpegInput::read), as libjpeg asks for them: the first of kFirstPiece
// bytes, each next one twice the last (up to kLargestPiece), so that a decode reads about what
// the image holds (at most a piece past its end; 16 KiB for the small image at the start of a
// 64 KiB sample) in a few calls, however large the image. What libjpeg's memory source does
// at the end of the bytes is done here too: a warning (the decode gives up) and an end marker.
struct PieceSource {
  static constexpr uint64_t kFirstPiece = 16 << 10;
  static constexpr uint64_t kLargestPiece = 1 << 20;

  jpeg_source_mgr pub;  // first: libjpeg's pointer to it is a pointer to this
  const JpegInput* input = nullptr;
  uint64_t next = 0;  // the offset of the next piece
  uint64_t piece = kFirstPiece;
  // The piece in hand: grown with the pieces by realloc (nothing may throw under libjpeg).
  std::unique_ptr<unsigned char, decltype(&std::free)> buffer{nullptr, &std::free};
  uint64_t room = 0;
  bool* warned = nullptr;
};

extern "C" void InitSource(j_decompress_ptr) {}
extern "C" void TermSource(j_decompress_ptr) {}

// The next piece into the buffer (src->next < the input's size); false if no memory is left for
// it.
bool ReadPiece(PieceSource* src) {
  const uint64_t n = std::min(src->piece, src->input->size - src->next);
  if (n > src->room) {
    void* grown = std::realloc(src->buffer.get(), n);
    if (grown == nullptr) return false;
    (void)src->buffer.release();
    src->buffer.reset(static_cast<unsigned char*>(grown));
    src->room = n;
  }
  src->input->read(src->next, n, reinterpret_cast<std::byte*>(src->buffer.get()));
  src->pub.next_input_byte = src->buffer.get();
  src->pub.bytes_in_buffer = n;
  src->next += n;
  src->piece = std::min(src->piece * 2, PieceSource::kLargestPiece);
  return true;
}

extern "C" boolean FillPiece(j_decompress_ptr c) {
  static const unsigned char kEnd[2] = {0xFF, JPEG_EOI};
  auto* src = reinterpret_cast<PieceSource*>(c->src);
  if (src->next >= src->input->size || !ReadPiece(src)) {
    *src->warned = true;
    src->pub.next_input_byte = kEnd;
    src->pub.bytes_in_buffer = sizeof(kEnd);
  }
  return TRUE;
}

extern "C" void SkipPiece(j_decompress_ptr c, long count) {
  if (count <= 0) return;
  auto* src = reinterpret_cast<PieceSource*>(c->src);
  const auto skip = static_cast<uint64_t>(count);
  if (skip <= src->pub.bytes_in_buffer) {
    src->pub.next_input_byte += skip;
    src->pub.bytes_in_buffer -= skip;
    return;
  }
  // Past the piece in hand: the next piece starts where the skip ends.
  const uint64_t past = skip - src->pub.bytes_in_buffer;
  src->pub.bytes_in_buffer = 0;
  src->next = std::min(src->input->size, src->next + past);
}

// One decode. The functions that call libjpeg set the jump point themselves and hold no object
// with a destructor, so that longjmp skips nothing.
class JpegDecode {
 public:
  JpegDecode(const LibJpeg& lib, const std::byte* data, size_t size)
      : lib_(lib),
        data_(reinterpret_cast<const unsigned char*>(data)),
        size_(static_cast<unsigned long>(size)) {
    Init();
  }
  // A JPEG in memory (input.data), or read in pieces (input.read); `input` outlives the decode.
  JpegDecode(const LibJpeg& lib, const JpegInput& input)
      : lib_(lib),
        data_(reinterpret_cast<const unsigned char*>(input.data)),
        size_(static_cast<unsigned long>(input.size)) {
    if (input.data == nullptr) {
      source_.input = &input;
      source_.warned = &err_.warned;
    }
    Init();
  }
  void Init() {
    cinfo_.err = lib_.std_error(&err_.pub);
    err_.pub.error_exit = JumpOnError;
    err_.pub.emit_message = NoteWarning;
    err_.pub.output_message = PrintNothing;
  }
  ~JpegDecode() {
    if (created_) lib_.destroy_decompress(&cinfo_);
  }
  JpegDecode(const JpegDecode&) = delete;
  JpegDecode& operator=(const JpegDecode&) = delete;

  // Reads the header: true if the image is one decoded here (8 bits, one or three channels of
  // gray, YCbCr or RGB, at most max_pixels pixels unless max_pixels is 0), with its size. A
  // library of another ABI than jpeglib.h's (version, struct size) fails here.
  bool ReadHeader(uint64_t max_pixels) {
    if (size_ < 2) return false;
    if (source_.input != nullptr) {
      // The first piece, which libjpeg reads first.
      if (!ReadPiece(&source_)) return false;
      const unsigned char* head = source_.buffer.get();
      if (head[0] != 0xFF || head[1] != 0xD8) return false;
    } else if (data_[0] != 0xFF || data_[1] != 0xD8) {
      return false;
    }
    if (setjmp(err_.jump)) return false;
    lib_.create_decompress(&cinfo_, JPEG_LIB_VERSION, sizeof(cinfo_));
    created_ = true;
    if (source_.input != nullptr) {
      source_.pub.init_source = InitSource;
      source_.pub.fill_input_buffer = FillPiece;
      source_.pub.skip_input_data = SkipPiece;
      source_.pub.resync_to_restart = lib_.resync_to_restart;
      source_.pub.term_source = TermSource;
      cinfo_.src = &source_.pub;
    } else {
      lib_.mem_src(&cinfo_, data_, size_);
    }
    if (lib_.read_header(&cinfo_, TRUE) != JPEG_HEADER_OK || err_.warned) return false;
    if (cinfo_.data_precision != 8) return false;
    const bool gray = cinfo_.num_components == 1 && cinfo_.jpeg_color_space == JCS_GRAYSCALE;
    const bool color = cinfo_.num_components == 3 &&
                       (cinfo_.jpeg_color_space == JCS_YCbCr || cinfo_.jpeg_color_space == JCS_RGB);
    if (!gray && !color) return false;
    const uint64_t pixels = uint64_t{cinfo_.image_width} * cinfo_.image_height;
    if (pixels == 0 || (max_pixels != 0 && pixels > max_pixels)) return false;
    cinfo_.out_color_space = JCS_RGB;
    return true;
  }
  uint32_t width() const { return cinfo_.image_width; }
  uint32_t height() const { return cinfo_.image_height; }

  // Decodes the pixels into out (width * height * 3 bytes, rows top to bottom): false on an
  // error or a warning.
  bool Decode(unsigned char* out) {
    if (setjmp(err_.jump)) return false;
    lib_.start_decompress(&cinfo_);
    if (cinfo_.output_width != cinfo_.image_width || cinfo_.output_height != cinfo_.image_height ||
        cinfo_.output_components != 3) {
      return false;
    }
    const size_t stride = size_t{cinfo_.output_width} * 3;
    while (cinfo_.output_scanline < cinfo_.output_height) {
      JSAMPROW row = out + size_t{cinfo_.output_scanline} * stride;
      if (lib_.read_scanlines(&cinfo_, &row, 1) != 1) return false;
    }
    lib_.finish_decompress(&cinfo_);
    return !err_.warned;
  }

 private:
  const LibJpeg& lib_;
  const unsigned char* data_;
  unsigned long size_;
  jpeg_decompress_struct cinfo_{};
  ErrorJump err_{};
  PieceSource source_{};  // a JPEG read in pieces (source_.input set)
  bool created_ = false;
};

const LibJpeg& LibJpegInUse(const char* call) {
  const LibJpeg* lib = g_libjpeg.load();
  if (lib == nullptr) {
    Raise(g_error, std::string("nopfs: ") + call +
                       ": no libjpeg in use yet: call use_libjpeg_of(PIL.Image.core.__file__) "
                       "first");
  }
  return *lib;
}

}  // namespace

py::list DecodeJpegsRgb(const std::vector<JpegInput>& inputs, uint64_t max_pixels) {
  const LibJpeg& lib = LibJpegInUse("Batch.decode_jpegs");
  const size_t n = inputs.size();
  std::vector<std::unique_ptr<JpegDecode>> jpegs(n);
  std::vector<char> ok(n, 0);
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < n; ++i) {
      jpegs[i] = std::make_unique<JpegDecode>(lib, inputs[i]);
      ok[i] = jpegs[i]->ReadHeader(max_pixels) ? 1 : 0;
    }
  }
  // The pixels' bytes objects are made with the GIL, filled without it (nothing else sees them).
  std::vector<py::object> pixels(n);
  std::vector<unsigned char*> out(n, nullptr);
  std::vector<std::pair<uint32_t, uint32_t>> sizes(n);
  for (size_t i = 0; i < n; ++i) {
    if (!ok[i]) continue;
    sizes[i] = {jpegs[i]->width(), jpegs[i]->height()};
    const size_t nbytes = size_t{sizes[i].first} * sizes[i].second * 3;
    pixels[i] = py::bytes(nullptr, nbytes);
    out[i] = reinterpret_cast<unsigned char*>(PyBytes_AS_STRING(pixels[i].ptr()));
  }
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < n; ++i) {
      if (ok[i]) ok[i] = jpegs[i]->Decode(out[i]) ? 1 : 0;
      jpegs[i].reset();
    }
  }
  py::list result(n);
  for (size_t i = 0; i < n; ++i) {
    if (ok[i]) {
      result[i] = py::make_tuple(py::make_tuple(sizes[i].first, sizes[i].second), pixels[i]);
    } else {
      result[i] = py::none();
    }
  }
  return result;
}

void BindJpeg(py::module_& m) {
  m.def(
      "use_libjpeg_of",
      [](const std::string& path) {
        if (g_libjpeg.load() == nullptr) {
          if (const LibJpeg* lib = LookUp(path)) g_libjpeg.store(lib);
        }
        return g_libjpeg.load() != nullptr;
      },
      py::arg("path"),
      "makes decode_jpeg_rgb decode with the libjpeg that the shared object at `path`, loaded "
      "already (PIL.Image.core.__file__), uses; True once a libjpeg is in use (the first one "
      "found stays), False if none is found there");

  m.def(
      "decode_jpeg_rgb",
      [](const py::buffer& data, uint64_t max_pixels) -> py::object {
        py::buffer_info info = data.request();
        if (!IsContiguous(info)) {
          throw py::value_error(
              "nopfs: decode_jpeg_rgb: data must be a contiguous buffer of bytes (bytes, a "
              "memoryview, a numpy uint8 array)");
        }
        const LibJpeg& lib = LibJpegInUse("decode_jpeg_rgb");
        const auto size = static_cast<size_t>(info.size * info.itemsize);
        JpegDecode jpeg(lib, static_cast<const std::byte*>(info.ptr), size);
        if (!jpeg.ReadHeader(max_pixels)) return py::none();
        const size_t nbytes = size_t{jpeg.width()} * jpeg.height() * 3;
        py::bytes pixels(nullptr, nbytes);
        auto* out = reinterpret_cast<unsigned char*>(PyBytes_AS_STRING(pixels.ptr()));
        bool ok;
        {
          py::gil_scoped_release nogil;
          ok = jpeg.Decode(out);
        }
        if (!ok) return py::none();
        return py::make_tuple(py::make_tuple(jpeg.width(), jpeg.height()), std::move(pixels));
      },
      py::arg("data"), py::arg("max_pixels") = 0,
      "((width, height), RGB bytes) of a JPEG (any buffer) that PIL decodes to the same pixels, "
      "decoded with PIL's libjpeg (use_libjpeg_of) without the GIL; None for any other data "
      "(decode it with PIL): not an 8-bit JPEG of one or three channels, more than max_pixels "
      "pixels (0: no limit), or a stream libjpeg reads only with a warning or an error");
}

}  // namespace nopfs::python
