# The dynrunner VM image: an OCI image that OpenSandbox boots as a microVM (Kata, Firecracker
# or fsb templates all start from an OCI image). Packer 1.6.6 compatible: no `packer {}`
# block, only built-in builders. `make vm-validate` checks it; see vm/README.md.

variable "base_image" {
  type        = string
  default     = "python:3.11-slim-bookworm"
  description = "Debian-based image with Python 3.11."
}

variable "image_repository" {
  type    = string
  default = "registry.example.org/dynrunner/vm"
}

variable "image_tag" {
  type    = string
  default = "dev"
}

variable "dist_dir" {
  type        = string
  default     = "dist"
  description = "Directory holding the dynrunner-proto and dynrunner-executor wheels, their pinned requirements and Node's (make vm-wheels)."
}

variable "spire_version" {
  type    = string
  default = "1.14.1"
}

variable "spire_url" {
  type        = string
  default     = ""
  description = "SPIRE release tarball; empty = the official release for spire_version (linux-amd64-musl)."
}

variable "executor_uid" {
  type        = number
  default     = 1001
  description = "uid of the `runner` user the executor runs as (the job's unix:uid selector)."
}

variable "spire_server_address" {
  type    = string
  default = "spire-server.spire.svc"
}

variable "spire_server_port" {
  type    = number
  default = 8081
}

variable "trust_domain" {
  type    = string
  default = "example.org"
}

locals {
  spire_url = var.spire_url != "" ? var.spire_url : "https://github.com/spiffe/spire/releases/download/v${var.spire_version}/spire-${var.spire_version}-linux-amd64-musl.tar.gz"
}

source "docker" "vm" {
  image  = var.base_image
  commit = true
  changes = [
    "ENTRYPOINT [\"/usr/local/bin/dynrunner-vm-entrypoint\"]",
    "WORKDIR /",
    "ENV SPIRE_SERVER_ADDRESS=${var.spire_server_address}",
    "ENV SPIRE_SERVER_PORT=${var.spire_server_port}",
    "ENV SPIRE_TRUST_DOMAIN=${var.trust_domain}",
    "ENV SPIFFE_AGENT_SOCKET=/run/spire/agent/public/api.sock",
    "ENV DYNRUNNER_EXECUTOR_USER=runner",
    "LABEL org.opencontainers.image.title=dynrunner-vm",
  ]
}

build {
  sources = ["source.docker.vm"]

  provisioner "file" {
    source      = "${var.dist_dir}/"
    destination = "/tmp/dynrunner-dist"
  }

  provisioner "file" {
    source      = "entrypoint.sh"
    destination = "/usr/local/bin/dynrunner-vm-entrypoint"
  }

  provisioner "file" {
    source      = "spire-agent.conf.template"
    destination = "/tmp/spire-agent.conf.template"
  }

  provisioner "shell" {
    environment_vars = [
      "SPIRE_URL=${local.spire_url}",
      "EXECUTOR_UID=${var.executor_uid}",
    ]
    inline = [
      "set -eu",
      "apt-get update && apt-get install -y --no-install-recommends ca-certificates curl git util-linux && rm -rf /var/lib/apt/lists/*",
      "apt-get update && apt-get install -y --no-install-recommends podman crun uidmap slirp4netns fuse-overlayfs && rm -rf /var/lib/apt/lists/*",
      "install -m 0755 /tmp/dynrunner-dist/dynrunner-agent /usr/local/bin/dynrunner-agent",
      "install -d -m 0755 /etc/containers && printf '[engine]\\ncgroup_manager = \"cgroupfs\"\\nevents_logger = \"file\"\\n' > /etc/containers/containers.conf",
      "pip install --no-cache-dir -r /tmp/dynrunner-dist/requirements.txt",
      "pip install --no-cache-dir --no-deps /tmp/dynrunner-dist/*.whl",
      "PIP=pip sh /tmp/dynrunner-dist/install-node.sh /tmp/dynrunner-dist/executor-node.txt /opt/node",
      "for tool in node npm npx corepack; do ln -s /opt/node/bin/$tool /usr/local/bin/$tool; done",
      "rm -rf /tmp/dynrunner-dist",
      "curl -fsSL \"$SPIRE_URL\" | tar -xz -C /opt && ln -s /opt/spire-*/bin/spire-agent /usr/local/bin/spire-agent",
      "install -d -m 0755 /etc/dynrunner && install -m 0644 /tmp/spire-agent.conf.template /etc/dynrunner/spire-agent.conf.template",
      "chmod 0755 /usr/local/bin/dynrunner-vm-entrypoint",
      "useradd --uid \"$EXECUTOR_UID\" --create-home --shell /bin/bash runner",
      "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 runner",
      "dynrunner-executor --help >/dev/null && dynrunner-identity --help >/dev/null && node --version && spire-agent --version && podman --version && test -x /usr/local/bin/dynrunner-agent",
    ]
  }

  post-processor "docker-tag" {
    repository = var.image_repository
    tags       = [var.image_tag]
  }
}
