// vd_connect / vd_disconnect, registration of a file (cpu backend) and release, channel open/close.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/c_api/handles.h"

using verifyd::c_api::Fail;
using verifyd::c_api::NullArgument;

extern "C" {

int vd_connect(const char* target, const char* client_id, const char* admin_token,
               double timeout_seconds, vd_client** out) {
  if (target == nullptr) return NullArgument("vd_connect", "target");
  if (out == nullptr) return NullArgument("vd_connect", "out");
  *out = nullptr;
  verifyd::ClientOptions options;
  if (client_id != nullptr) options.client_id = client_id;
  if (admin_token != nullptr) options.admin_token = admin_token;
  if (std::isfinite(timeout_seconds) && timeout_seconds > 0) {
    options.default_deadline = absl::Seconds(timeout_seconds);
  }
  absl::StatusOr<std::unique_ptr<verifyd::Client>> client =
      verifyd::Client::Connect(target, std::move(options));
  if (!client.ok()) return Fail(client.status());
  *out = new vd_client{*std::move(client)};
  return 0;
}

void vd_disconnect(vd_client* client) { delete client; }

const char* vd_client_id(const vd_client* client) {
  return client == nullptr ? "" : client->client->options().client_id.c_str();
}

int vd_register_file(vd_client* client, const char* path, uint64_t bytes, uint32_t device,
                     uint64_t* region) {
  if (client == nullptr) return NullArgument("vd_register_file", "client");
  if (path == nullptr) return NullArgument("vd_register_file", "path");
  if (region == nullptr) return NullArgument("vd_register_file", "region");
  auto registered = client->client->RegisterExternalMemory(path, bytes, device);
  if (!registered.ok()) return Fail(registered.status());
  *region = registered->region();
  return 0;
}

int vd_release_memory(vd_client* client, uint64_t region, uint64_t* bytes) {
  if (client == nullptr) return NullArgument("vd_release_memory", "client");
  auto released = client->client->ReleaseExternalMemory(region);
  if (!released.ok()) return Fail(released.status());
  if (bytes != nullptr) *bytes = released->bytes();
  return 0;
}

int vd_channel_open(vd_client* client, uint32_t entries, vd_channel** out) {
  if (client == nullptr) return NullArgument("vd_channel_open", "client");
  if (out == nullptr) return NullArgument("vd_channel_open", "out");
  *out = nullptr;
  auto channel = client->client->OpenChannel(entries == 0 ? 64 : entries);
  if (!channel.ok()) return Fail(channel.status());
  *out = new vd_channel{*std::move(channel), {}};
  return 0;
}

int vd_channel_close(vd_channel* channel) {
  if (channel == nullptr) return 0;
  const absl::Status closed = channel->channel->Close();
  delete channel;
  return Fail(closed);
}

uint64_t vd_channel_id(const vd_channel* channel) {
  return channel == nullptr ? 0 : channel->channel->id();
}

uint32_t vd_channel_entries(const vd_channel* channel) {
  return channel == nullptr ? 0 : channel->channel->entries();
}

uint64_t vd_channel_in_flight(const vd_channel* channel) {
  return channel == nullptr ? 0 : channel->channel->in_flight() + channel->pending.size();
}

void vd_channel_heartbeat(vd_channel* channel) {
  if (channel != nullptr) channel->channel->Heartbeat();
}

}  // extern "C"
