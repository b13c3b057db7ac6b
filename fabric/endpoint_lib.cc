// Endpoint's library and provider: libfabric loaded on the first endpoint, the defaults nopfs sets
// in its environment, its errors as text, the hints given to fi_getinfo, and the return of RMA
// read buffers to their pool.
#include "fabric/endpoint_impl.h"

namespace nopfs::fabric {
namespace endpoint_detail {

const Lib& Libfabric() {
  static Lib lib;
  static std::once_flag once;
  std::call_once(once, [] {
    (void)SetLibfabricDefaults();
    void* h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      lib.error = e != nullptr ? e : "dlopen failed";
      return;
    }
    const auto sym = [h](const char* name) { return dlsym(h, name); };
    lib.getinfo = reinterpret_cast<decltype(lib.getinfo)>(sym("fi_getinfo"));
    lib.freeinfo = reinterpret_cast<decltype(lib.freeinfo)>(sym("fi_freeinfo"));
    lib.dupinfo = reinterpret_cast<decltype(lib.dupinfo)>(sym("fi_dupinfo"));
    lib.fabric = reinterpret_cast<decltype(lib.fabric)>(sym("fi_fabric"));
    lib.strerror = reinterpret_cast<decltype(lib.strerror)>(sym("fi_strerror"));
    if (!lib.getinfo || !lib.freeinfo || !lib.dupinfo || !lib.fabric || !lib.strerror) {
      lib = Lib();
      lib.error =
          "libfabric.so.1 lacks one of fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric, "
          "fi_strerror";
    }
  });
  return lib;
}

std::string FiError(const char* what, long rc) {
  return std::string(what) + ": " + Libfabric().strerror(static_cast<int>(rc < 0 ? -rc : rc));
}

InfoPtr MakeHints(const std::string& provider, bool remote_read) {
  InfoPtr hints(Libfabric().dupinfo(nullptr));  // fi_allocinfo()
  if (!hints) throw std::bad_alloc();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  if (remote_read) {
    hints->caps |= FI_RMA | FI_READ | FI_REMOTE_READ;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_ENDPOINT;
    hints->domain_attr->mr_key_size = 8;
  }
  hints->addr_format = FI_SOCKADDR_IN;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (hints->fabric_attr->prov_name == nullptr) throw std::bad_alloc();
  return hints;
}

}  // namespace endpoint_detail

std::vector<std::string> SetLibfabricDefaults() {
  std::vector<std::string> set;
  for (const LibfabricDefault& d : kLibfabricDefaults) {
    if (std::getenv(d.name) != nullptr) continue;  // the admin's (or the job's) own value
    if (::setenv(d.name, d.value, 0) == 0) set.emplace_back(d.name);
  }
  return set;
}

void ReturnToPool::operator()(std::byte* p) const {
  if (p == nullptr) return;
  if (pool) {
    pool->Put(p, capacity);
  } else {
    delete[] p;
  }
}

}  // namespace nopfs::fabric
