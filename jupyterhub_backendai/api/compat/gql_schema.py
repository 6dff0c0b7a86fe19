"""The part of Backend.AI's GraphQL schema this hub answers (``POST /admin/gql``), as
SDL: the types and root fields its clients' queries and mutations use. The resolvers are
:mod:`.gql`'s; graphql-core builds and validates against :data:`SCHEMA`."""

from __future__ import annotations

from graphql import build_schema


def _inputs(create: str, modify: str, fields: str) -> str:
    """An input type to create an object and its twin to modify one, from one list of
    fields, one a line: a field marked ``!`` is required to create and optional to
    modify; one starting ``+`` is the modify type's only, ``-`` the create type's only."""
    made: dict[str, list[str]] = {create: [], modify: []}
    for line in fields.strip().splitlines():
        f = line.strip()
        if f[0] != "+":
            made[create].append(f.lstrip("- "))
        if f[0] != "-":
            made[modify].append(f.lstrip("+ ").removesuffix("!"))
    return "".join(f"input {name} {{\n  " + "\n  ".join(fs) + "\n}\n\n"
                   for name, fs in made.items())


SDL = """
scalar UUID

type KeyPair {
  user_id: String
  access_key: String
  secret_key: String
  is_active: Boolean
  is_admin: Boolean
  resource_policy: String
  rate_limit: Int
  created_at: String
  modified_at: String
  last_used: String
  concurrency_used: Int
  num_queries: Int
  projects: [String]
  user_info: UserInfo
}

type Dependency { id: UUID name: String status: String }

type Container {
  id: UUID
  cluster_role: String
  cluster_idx: Int
  cluster_hostname: String
  session_id: UUID
  image: String
  registry: String
  status: String
  status_info: String
  status_data: String
  status_changed: String
  agent: String
  container_id: String
  resource_opts: String
  occupied_slots: String
  preopen_ports: [Int]
  live_stat: String
  last_stat: String
}

type ComputeSession {
  id: UUID
  main_kernel_id: UUID
  tag: String
  name: String
  type: String
  image: String
  registry: String
  cluster_template: String
  cluster_mode: String
  cluster_size: Int
  domain_name: String
  group_name: String
  group_id: UUID
  agent_ids: [String]
  user_email: String
  user_id: UUID
  access_key: String
  created_user_email: String
  created_user_id: UUID
  status: String
  status_info: String
  status_data: String
  status_changed: String
  created_at: String
  terminated_at: String
  starts_at: String
  scheduled_at: String
  startup_command: String
  result: String
  resource_opts: String
  scaling_group: String
  service_ports: String
  mounts: [String]
  occupying_slots: String
  containers: [Container]
  dependencies: [Dependency]
  abusing_reports: [String]
  idle_checks: String
}

type ComputeSessionList { items: [ComputeSession]! total_count: Int! }

type VirtualFolder {
  id: UUID
  host: String
  quota_scope_id: String
  name: String
  user: UUID
  user_email: String
  group: UUID
  group_name: String
  creator: String
  domain_name: String
  unmanaged_path: String
  usage_mode: String
  permission: String
  ownership_type: String
  max_files: Int
  max_size: Float
  created_at: String
  last_used: String
  num_files: Int
  cur_size: Float
  cloneable: Boolean
  status: String
}

type VirtualFolderList { items: [VirtualFolder]! total_count: Int! }

type Domain {
  name: String
  description: String
  is_active: Boolean
  created_at: String
  modified_at: String
  total_resource_slots: String
  allowed_vfolder_hosts: String
  allowed_docker_registries: [String]
  integration_id: String
}

type Group {
  id: UUID
  name: String
  description: String
  is_active: Boolean
  created_at: String
  modified_at: String
  domain_name: String
  total_resource_slots: String
  allowed_vfolder_hosts: String
  integration_id: String
  resource_policy: String
}

type UserGroup { id: UUID name: String }

type User {
  id: ID
  uuid: UUID
  username: String
  email: String
  full_name: String
  description: String
  need_password_change: Boolean
  status: String
  status_info: String
  is_active: Boolean
  created_at: String
  modified_at: String
  domain_name: String
  role: String
  resource_policy: String
  groups: [UserGroup]
  allowed_client_ip: [String]
  totp_activated: Boolean
  sudo_session_enabled: Boolean
  main_access_key: String
  container_uid: Int
  container_main_gid: Int
  container_gids: [Int]
}

type UserList { items: [User]! total_count: Int! }

type UserInfo { email: String full_name: String }

type KeyPairList { items: [KeyPair]! total_count: Int! }

type KeyPairResourcePolicy {
  name: String
  created_at: String
  default_for_unspecified: String
  total_resource_slots: String
  max_session_lifetime: Int
  max_lifetime_extension: Int
  max_concurrent_sessions: Int
  max_containers_per_session: Int
  idle_timeout: Int
  max_vfolder_count: Int
  max_vfolder_size: Float
  max_quota_scope_size: Float
  allowed_vfolder_hosts: String
  max_pending_session_count: Int
  max_pending_session_resource_slots: String
  max_concurrent_sftp_sessions: Int
}

type Agent {
  id: ID
  status: String
  status_changed: String
  region: String
  architecture: String
  scaling_group: String
  schedulable: Boolean
  available_slots: String
  occupied_slots: String
  addr: String
  first_contact: String
  lost_at: String
  live_stat: String
  version: String
  compute_plugins: String
  hardware_metadata: String
  compute_containers: [Container]
  local_config: String
  cpu_cur_pct: Float
  mem_cur_bytes: Float
}

type AgentList { items: [Agent]! total_count: Int! }

type ScalingGroup {
  name: String
  description: String
  is_active: Boolean
  is_public: Boolean
  created_at: String
  wsproxy_addr: String
  wsproxy_api_token: String
  driver: String
  driver_opts: String
  scheduler: String
  scheduler_opts: String
  use_host_network: Boolean
}

type StorageVolume {
  id: String
  backend: String
  fsprefix: String
  path: String
  capabilities: [String]
  hardware_metadata: String
  performance_metric: String
  usage: String
}

type StorageVolumeList { items: [StorageVolume]! total_count: Int! }

""" + _inputs("UserInput", "ModifyUserInput", """
  username: String
  password: String!
  need_password_change: Boolean
  full_name: String
  description: String
  is_active: Boolean
  status: String
  domain_name: String!
  role: String
  allowed_client_ip: [String]
  totp_activated: Boolean
  resource_policy: String
  sudo_session_enabled: Boolean
  group_ids: [String]
  + main_access_key: String
  container_uid: Int
  container_main_gid: Int
  container_gids: [Int]
""") + _inputs("KeyPairInput", "ModifyKeyPairInput", """
  is_active: Boolean
  is_admin: Boolean
  resource_policy: String
  concurrency_limit: Int
  rate_limit: Int
""") + _inputs("DomainInput", "ModifyDomainInput", """
  + name: String
  description: String
  is_active: Boolean
  total_resource_slots: String
  allowed_vfolder_hosts: String
  allowed_docker_registries: [String]
  integration_id: String
""") + _inputs("GroupInput", "ModifyGroupInput", """
  - type: String
  + name: String
  description: String
  is_active: Boolean
  domain_name: String!
  total_resource_slots: String
  + user_update_mode: String
  + user_uuids: [String]
  allowed_vfolder_hosts: String
  integration_id: String
  resource_policy: String
""") + """
input PurgeUserInput { purge_shared_vfolders: Boolean delegate_endpoint_ownership: Boolean }

type CreateGroup { ok: Boolean msg: String group: Group }
type ModifyGroup { ok: Boolean msg: String group: Group }
type CreateDomain { ok: Boolean msg: String domain: Domain }
type ModifyDomain { ok: Boolean msg: String domain: Domain }
""" + _inputs("CreateKeyPairResourcePolicyInput", "ModifyKeyPairResourcePolicyInput", """
  default_for_unspecified: String
  total_resource_slots: String
  max_session_lifetime: Int
  max_lifetime_extension: Int
  max_concurrent_sessions: Int
  max_concurrent_sftp_sessions: Int
  max_containers_per_session: Int
  idle_timeout: Int
  allowed_vfolder_hosts: String
  max_vfolder_count: Int
  max_vfolder_size: Float
  max_quota_scope_size: Float
  max_pending_session_count: Int
  max_pending_session_resource_slots: String
""") + """
type CreateKeyPairResourcePolicy {
  ok: Boolean msg: String resource_policy: KeyPairResourcePolicy
}
""" + _inputs("CreateScalingGroupInput", "ModifyScalingGroupInput", """
  description: String
  is_active: Boolean
  is_public: Boolean
  driver: String
  driver_opts: String
  scheduler: String
  scheduler_opts: String
  use_host_network: Boolean
  wsproxy_addr: String
  wsproxy_api_token: String
""") + """
type CreateScalingGroup { ok: Boolean msg: String scaling_group: ScalingGroup }
type CreateUser { ok: Boolean msg: String user: User }
type ModifyUser { ok: Boolean msg: String user: User }
type CreateKeyPair { ok: Boolean msg: String keypair: KeyPair }
type MutationResult { ok: Boolean msg: String }

# Issue 25: the image catalogue (api/compat/images.py)
type Image {
  id: String
  name: String
  humanized_name: String
  namespace: String
  base_image_name: String
  registry: String
  architecture: String
  tag: String
  digest: String
  size_bytes: Float
  aliases: [String]
  labels: [KVPair]
  hidden: Boolean
  is_default: Boolean
  description: String
  installed: Boolean
  resource_limits: [ResourceLimit]
}
type KVPair { key: String value: String }
type ResourceLimit { key: String min: String max: String }
type RescanImages { ok: Boolean msg: String task_id: String }

type Mutation {
  create_domain(name: String!, props: DomainInput!): CreateDomain
  modify_domain(name: String!, props: ModifyDomainInput!): ModifyDomain
  delete_domain(name: String!): MutationResult
  purge_domain(name: String!): MutationResult
  create_keypair_resource_policy(name: String!, props: CreateKeyPairResourcePolicyInput!):
    CreateKeyPairResourcePolicy
  modify_keypair_resource_policy(name: String!, props: ModifyKeyPairResourcePolicyInput!):
    MutationResult
  delete_keypair_resource_policy(name: String!): MutationResult
  create_scaling_group(name: String!, props: CreateScalingGroupInput!): CreateScalingGroup
  modify_scaling_group(name: String!, props: ModifyScalingGroupInput!): MutationResult
  delete_scaling_group(name: String!): MutationResult
  create_group(name: String!, props: GroupInput!): CreateGroup
  modify_group(gid: UUID!, props: ModifyGroupInput!): ModifyGroup
  delete_group(gid: UUID!): MutationResult
  purge_group(gid: UUID!): MutationResult
  create_user(email: String!, props: UserInput!): CreateUser
  modify_user(email: String!, props: ModifyUserInput!): ModifyUser
  delete_user(email: String!): MutationResult
  purge_user(email: String!, props: PurgeUserInput): MutationResult
  associate_scaling_group_with_domain(scaling_group: String!, domain: String!): MutationResult
  disassociate_scaling_group_with_domain(scaling_group: String!, domain: String!):
    MutationResult
  disassociate_all_scaling_groups_with_domain(domain: String!): MutationResult
  associate_scaling_group_with_user_group(scaling_group: String!, user_group: UUID!):
    MutationResult
  # (the 23.09 client declares this one's $user_group a String!)
  disassociate_scaling_group_with_user_group(scaling_group: String!, user_group: String!):
    MutationResult
  disassociate_all_scaling_groups_with_group(user_group: UUID!): MutationResult
  associate_scaling_group_with_keypair(scaling_group: String!, access_key: String!):
    MutationResult
  disassociate_scaling_group_with_keypair(scaling_group: String!, access_key: String!):
    MutationResult
  create_keypair(user_id: String!, props: KeyPairInput!): CreateKeyPair
  modify_keypair(access_key: String!, props: ModifyKeyPairInput!): MutationResult
  delete_keypair(access_key: String!): MutationResult
  rescan_images(registry: String, project: String): RescanImages
  alias_image(alias: String!, target: String!, architecture: String): MutationResult
  dealias_image(alias: String!, architecture: String): MutationResult
}

type Query {
  images(is_installed: Boolean, is_operation: Boolean, image_filters: [String]): [Image]
  domain(name: String): Domain
  domains(is_active: Boolean): [Domain]
  group(id: UUID!, domain_name: String): Group
  groups(domain_name: String, is_active: Boolean): [Group]
  groups_by_name(name: String!, domain_name: String): [Group]
  user(domain_name: String, email: String): User
  user_from_uuid(domain_name: String, user_id: ID): User
  users(domain_name: String, group_id: UUID, is_active: Boolean, status: String): [User]
  user_list(limit: Int!, offset: Int!, filter: String, order: String, domain_name: String,
            group_id: UUID, is_active: Boolean, status: String): UserList
  keypairs(domain_name: String, email: String, is_active: Boolean): [KeyPair]
  keypair_list(limit: Int!, offset: Int!, filter: String, order: String, domain_name: String,
               email: String, is_active: Boolean): KeyPairList
  keypair_resource_policy(name: String): KeyPairResourcePolicy
  keypair_resource_policies: [KeyPairResourcePolicy]
  scaling_group(name: String): ScalingGroup
  scaling_groups(name: String, is_active: Boolean): [ScalingGroup]
  storage_volume(id: String): StorageVolume
  storage_volume_list(limit: Int!, offset: Int!, filter: String, order: String): StorageVolumeList
  agent(agent_id: String!): Agent
  agent_list(limit: Int!, offset: Int!, status: String, scaling_group: String, filter: String,
             order: String): AgentList
  keypair(domain_name: String, access_key: String): KeyPair
  compute_session(id: UUID!): ComputeSession
  compute_session_list(limit: Int!, offset: Int!, status: String, access_key: String,
                       filter: String, order: String): ComputeSessionList
  vfolder_list(limit: Int!, offset: Int!, group_id: UUID, filter: String,
               order: String): VirtualFolderList
  vfolder_own_list(limit: Int!, offset: Int!, filter: String, order: String): VirtualFolderList
  vfolder_invited_list(limit: Int!, offset: Int!, filter: String,
                       order: String): VirtualFolderList
  vfolder_project_list(limit: Int!, offset: Int!, filter: String,
                       order: String): VirtualFolderList
}
"""

SCHEMA = build_schema(SDL)
