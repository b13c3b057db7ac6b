// Endpoint's traffic: tagged sends (posted, or waited for), receives with their wait and
// cancellation, and RMA: memory exposed for peers' reads and reads of theirs.
#include "fabric/endpoint_impl.h"

namespace nopfs::fabric {

Result<Op*> Endpoint::Impl::PostSend(PeerAddr peer, uint64_t tag, std::vector<std::byte> data,
                                     std::chrono::steady_clock::time_point deadline,
                                     std::vector<std::byte> tail,
                                     std::span<const std::byte> borrowed) {
  Impl* impl = this;
  Op* op = impl->NewOp();
  op->capacity = data.size();
  op->message = std::move(data);
  op->tail = std::move(tail);
  op->borrowed = op->tail.empty() ? borrowed : std::span<const std::byte>(op->tail);
  if (op->message.empty()) op->message.resize(1);  // a valid buffer for an empty message
  if (!op->borrowed.empty()) {
    NOPFS_RETURN_IF_ERROR(impl->PostRetrying(op, deadline, "fabric: fi_tsendv", "send", [&] {
      // fi_tsendv only reads the parts; its iovec type is not const.
      iovec iov[2] = {{op->message.data(), op->capacity},
                      {const_cast<std::byte*>(op->borrowed.data()), op->borrowed.size()}};
      return fi_tsendv(impl->ep.get(), iov, nullptr, 2, peer, tag, &op->ctx);
    }));
    return op;
  }
  NOPFS_RETURN_IF_ERROR(impl->PostRetrying(op, deadline, "fabric: fi_tsend", "send", [&] {
    return fi_tsend(impl->ep.get(), op->message.data(), op->capacity, nullptr, peer, tag, &op->ctx);
  }));
  return op;
}

Status Endpoint::Post(PeerAddr peer, uint64_t tag, std::span<const std::byte> data,
                      std::chrono::milliseconds timeout) {
  return Post(peer, tag, std::vector<std::byte>(data.begin(), data.end()), timeout);
}

Status Endpoint::Post(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& data,
                      std::chrono::milliseconds timeout) {
  auto posted =
      impl_->PostSend(peer, tag, std::move(data), std::chrono::steady_clock::now() + timeout);
  if (!posted.ok()) return posted.status();
  // Freed by Poll when it completes. Not polled here: the provider has started the send (tcp
  // writes to the socket at once), and a caller that posts several messages polls once after.
  (*posted)->abandoned = true;
  return Status::Ok();
}

Status Endpoint::Post(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& head,
                      std::vector<std::byte>&& tail, std::chrono::milliseconds timeout) {
  auto posted = impl_->PostSend(peer, tag, std::move(head),
                                std::chrono::steady_clock::now() + timeout, std::move(tail));
  if (!posted.ok()) return posted.status();
  (*posted)->abandoned = true;  // freed by Poll when it completes
  return Status::Ok();
}

Status Endpoint::PostBorrowed(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& head,
                              std::span<const std::byte> tail, std::chrono::milliseconds timeout) {
  auto posted = impl_->PostSend(peer, tag, std::move(head),
                                std::chrono::steady_clock::now() + timeout, {}, tail);
  if (!posted.ok()) return posted.status();
  (*posted)->abandoned = true;  // freed by Poll when it completes
  return Status::Ok();
}

Status Endpoint::Send(PeerAddr peer, uint64_t tag, std::span<const std::byte> data,
                      std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto posted =
      impl_->PostSend(peer, tag, std::vector<std::byte>(data.begin(), data.end()), deadline);
  if (!posted.ok()) return posted.status();
  Op* op = *posted;
  while (!op->done) {
    impl_->Poll();
    if (op->done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      op->abandoned = true;  // freed when libfabric completes it or the endpoint closes
      return Status::TimedOut("fabric: send not completed within " +
                              std::to_string(timeout.count()) + " ms");
    }
  }
  const int err = op->error;
  const std::string text = std::move(op->error_text);
  impl_->Drop(op);
  if (err != 0) return Status::IoError("fabric: send failed: " + text);
  return Status::Ok();
}

Result<Message> Endpoint::Recv(uint64_t tag, uint64_t ignore, uint64_t max_len,
                               std::chrono::milliseconds timeout,
                               const std::function<bool()>& interrupt) {
  Message m;
  NOPFS_RETURN_IF_ERROR(RecvView(tag, ignore, max_len, timeout, interrupt,
                                 [&m](uint64_t t, std::span<const std::byte> data) {
                                   m.tag = t;
                                   m.data.assign(data.begin(), data.end());
                                 }));
  return m;
}

Status Endpoint::RecvView(uint64_t tag, uint64_t ignore, uint64_t max_len,
                          std::chrono::milliseconds timeout, const std::function<bool()>& interrupt,
                          const MessageView& take) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  Op* op = nullptr;
  if (impl_->standing != nullptr) {
    Op* st = std::exchange(impl_->standing, nullptr);
    if (impl_->standing_tag == tag && impl_->standing_ignore == ignore &&
        impl_->standing_max == max_len) {
      op = st;  // the same messages: wait on it again
    } else if (std::optional<Message> m = impl_->CancelRecv(st, impl_->standing_max);
               m && (m->tag & ~ignore) == (tag & ~ignore) && m->data.size() <= max_len) {
      take(m->tag, m->data);
      return Status::Ok();
    }  // else what the old receive got, if anything, was for another caller: dropped
  }
  if (op == nullptr) {
    op = impl_->NewOp();
    op->capacity = max_len;
    if (impl_->spare && impl_->spare_capacity >= max_len) {
      op->buffer = std::move(impl_->spare);
      op->capacity = impl_->spare_capacity;
    } else {
      op->buffer.reset(new std::byte[max_len == 0 ? 1 : max_len]);  // uninitialised: no zeroing
    }
    NOPFS_RETURN_IF_ERROR(impl_->PostRetrying(op, deadline, "fabric: fi_trecv", "receive", [&] {
      return fi_trecv(impl_->ep.get(), op->buffer.get(), max_len, nullptr, FI_ADDR_UNSPEC, tag,
                      ignore, &op->ctx);
    }));
  }
  while (!op->done) {
    impl_->Poll();
    if (op->done) break;
    if (interrupt && interrupt()) {
      // fall through to the end of the wait below
    } else {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left > std::chrono::steady_clock::duration::zero()) {
        impl_->Idle(std::min<std::chrono::microseconds>(
                        std::chrono::duration_cast<std::chrono::microseconds>(left),
                        std::chrono::milliseconds(50)),
                    &interrupt);
        continue;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline || (interrupt && interrupt())) {
      // The receive stays posted for the next Recv (Impl::standing).
      impl_->standing = op;
      impl_->standing_tag = tag;
      impl_->standing_ignore = ignore;
      impl_->standing_max = max_len;
      return Status::TimedOut("fabric: no message within " + std::to_string(timeout.count()) +
                              " ms");
    }
  }
  if (op->error != 0) {
    const int err = op->error;
    const std::string text = std::move(op->error_text);
    impl_->Recycle(op);
    if (err == FI_ETRUNC) {
      return Status::Corruption("fabric: message longer than " + std::to_string(max_len) +
                                " bytes rejected");
    }
    return Status::IoError("fabric: receive failed: " + text);
  }
  // Recycled after `take`, even if it throws.
  struct RecycleAfter {
    Impl* impl;
    Op* op;
    ~RecycleAfter() { impl->Recycle(op); }
  } recycle{impl_.get(), op};
  take(op->tag, {op->buffer.get(), std::min(op->len, max_len)});
  return Status::Ok();
}

Result<ExposedRegion> Endpoint::ExposeForRemoteRead(std::span<const std::byte> region,
                                                    uint64_t key) {
  if (!impl_->remote_read) {
    return Status::FailedPrecondition("fabric: this endpoint does not do RMA reads");
  }
  if (region.empty()) return Status::InvalidArgument("fabric: an empty region");
  FidPtr<fid_mr> mr;
  int rc = OpenFid(&mr, [&](fid_mr** m) {
    return fi_mr_reg(impl_->domain.get(), region.data(), region.size(), FI_REMOTE_READ, 0, key, 0,
                     m, nullptr);
  });
  if (rc != 0) return Status::IoError(FiError("fabric: fi_mr_reg", rc));
  if ((impl_->info->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
    if ((rc = fi_mr_bind(mr.get(), &impl_->ep->fid, 0)) != 0 ||
        (rc = fi_mr_enable(mr.get())) != 0) {
      return Status::IoError(FiError("fabric: binding a registration to the endpoint", rc));
    }
  }
  if (fi_mr_key(mr.get()) != key) {  // the provider ignored the requested key: do not use it
    return Status::FailedPrecondition("fabric: the provider chose its own registration key");
  }
  impl_->regions.push_back(std::move(mr));
  ExposedRegion out;
  out.key = key;
  const bool virt = (impl_->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  out.wire_base = virt ? reinterpret_cast<uint64_t>(region.data()) : 0;
  return out;
}

Status Endpoint::PostRead(PeerAddr peer, uint64_t addr, uint64_t key, uint64_t length,
                          uint64_t cookie, std::chrono::milliseconds timeout) {
  if (!impl_->remote_read) {
    return Status::FailedPrecondition("fabric: this endpoint does not do RMA reads");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Op* op = impl_->NewOp();
  op->is_read = true;
  op->cookie = cookie;
  op->capacity = length;
  op->read_buffer = ReadBufferPool::Get(impl_->read_pool, length);
  if (length == 0) {  // nothing to read: complete at once
    impl_->Finish(op);
    return Status::Ok();
  }
  NOPFS_RETURN_IF_ERROR(impl_->PostRetrying(op, deadline, "fabric: fi_read", "read", [&] {
    return fi_read(impl_->ep.get(), op->read_buffer.get(), length, nullptr, peer, addr, key,
                   &op->ctx);
  }));
  return Status::Ok();  // collected by TakeReads, which polls
}

}  // namespace nopfs::fabric
