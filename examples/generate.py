#!/usr/bin/env python3
"""Writes the example cluster and pods used by the README's first command.

A mixed cluster: 2-NUMA CPU nodes with SR-IOV NICs, 4-NUMA GPU nodes with GPUs and NICs on
different NUMA nodes, a tainted edge node, and a node without a NodeResourceTopology.
Run: python3 examples/generate.py (rewrites examples/cluster.yaml and examples/pods.yaml).
"""
import json
import os

GI = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))


def qty_bytes(b):
    for unit, size in (("Gi", GI), ("Mi", 1 << 20)):
        if b % size == 0:
            return f"{b // size}{unit}"
    return str(b)


def nrt(name, policy, scope, zones, distances):
    out_zones = []
    for z in zones:
        resources = []
        attrs = []
        for rname, (cap, avail) in sorted(z["res"].items()):
            fmt = qty_bytes if rname == "memory" or rname.startswith("hugepages-") else str
            resources.append({"name": rname, "capacity": fmt(cap), "allocatable": fmt(cap), "available": fmt(avail)})
        for rname, ids in sorted(z.get("free", {}).items()):
            attrs.append({"name": f"numaplane.io/free-devices.{rname}", "value": ",".join(ids)})
        zone = {"name": f"node-{z['id']}", "type": "Node",
                "costs": [{"name": f"node-{j}", "value": distances[z['id']][j]} for j in sorted(distances[z['id']])],
                "resources": resources}
        if attrs:
            zone["attributes"] = attrs
        out_zones.append(zone)
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name},
            "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                           {"name": "topologyManagerScope", "value": scope},
                           {"name": "nodeTopologyPodsFingerprintMethod", "value": "with-exclusive-resources"}],
            "zones": out_zones}


def node(name, alloc, labels=None, taints=None):
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
         "status": {"allocatable": alloc, "capacity": alloc}}
    if taints:
        n["spec"] = {"taints": taints}
    return n


def dist(n):
    return {i: {j: (10 if i == j else (12 if i // 2 == j // 2 else 21)) for j in range(n)} for i in range(n)}


docs = []
# Two 2-NUMA CPU nodes for telco CNFs: 32 CPUs (2 reserved), 128Gi, 8x1Gi hugepages, 4 SR-IOV VFs per zone.
for name, used_cpu in (("cpu-a", 0), ("cpu-b", 20)):
    zones = []
    for z in range(2):
        vfs = [f"0000:{0x3b + 0x40 * z:02x}:02.{i}" for i in range(4)]
        zones.append({"id": z, "res": {"cpu": (32, 30 - (used_cpu if z == 0 else 0)), "memory": (120 * GI, 120 * GI),
                                      "hugepages-1Gi": (8 * GI, 8 * GI), "intel.com/sriov_netdevice": (4, 4)},
                      "free": {"intel.com/sriov_netdevice": vfs}})
    docs.append(node(name, {"cpu": "64", "memory": "256Gi", "hugepages-1Gi": "16Gi", "intel.com/sriov_netdevice": "8",
                            "pods": "110", "ephemeral-storage": "500Gi"}, {"numaplane.io/pool": "cnf"}))
    docs.append(nrt(name, "single-numa-node", "container", zones, dist(2)))
# GPU training node: 4 NUMA, 2 GPUs per zone, one 400G NIC on zones 0 and 2; restricted/pod.
zones = []
for z in range(4):
    free = {"nvidia.com/gpu": [f"GPU-{z * 2}", f"GPU-{z * 2 + 1}"]}
    res = {"cpu": (24, 24), "memory": (250 * GI, 250 * GI), "nvidia.com/gpu": (2, 2)}
    if z % 2 == 0:
        res["mellanox.com/cx7"] = (1, 1)
        free["mellanox.com/cx7"] = [f"mlx5_{z // 2}"]
    zones.append({"id": z, "res": res, "free": free})
docs.append(node("gpu-a", {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": "8", "mellanox.com/cx7": "2", "pods": "110"},
                 {"numaplane.io/pool": "gpu"}))
docs.append(nrt("gpu-a", "restricted", "pod", zones, dist(4)))
# GPU inference node: 4 NUMA, GPUs only on zones 0 and 1, one GPU already taken; single-numa-node/pod.
zones = []
for z in range(4):
    res = {"cpu": (16, 16 - (4 if z == 0 else 0)), "memory": (120 * GI, 120 * GI - (8 * GI if z == 0 else 0))}
    free = {}
    if z < 2:
        ids = [f"GPU-{z * 2}", f"GPU-{z * 2 + 1}"]
        if z == 0:
            ids = ids[1:]
        res["nvidia.com/gpu"] = (2, len(ids))
        free["nvidia.com/gpu"] = ids
    zones.append({"id": z, "res": res, "free": free})
docs.append(node("gpu-b", {"cpu": "64", "memory": "480Gi", "nvidia.com/gpu": "4", "pods": "110"}, {"numaplane.io/pool": "gpu"}))
docs.append(nrt("gpu-b", "single-numa-node", "pod", zones, dist(4)))
# Edge node: tainted, best-effort/container.
zones = [{"id": z, "res": {"cpu": (8, 8), "memory": (30 * GI, 30 * GI)}} for z in range(2)]
docs.append(node("edge-1", {"cpu": "16", "memory": "60Gi", "pods": "30"}, {"numaplane.io/pool": "edge"},
                 [{"key": "dedicated", "value": "edge", "effect": "NoSchedule"}]))
docs.append(nrt("edge-1", "best-effort", "container", zones, dist(2)))
# A node whose exporter is not deployed yet: no NRT.
docs.append(node("legacy-1", {"cpu": "16", "memory": "64Gi", "pods": "110"}))
# The pod already running on gpu-b (it holds GPU-0 and 4 exclusive CPUs on NUMA 0).
docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml", "name": "inference-0"},
             "spec": {"nodeName": "gpu-b", "containers": [{"name": "server", "resources": {
                 "requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"},
                 "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running"}})


def pod(ns, name, containers, init=None, tolerations=None, selector=None):
    spec = {"schedulerName": "numaplane", "containers": containers}
    if init:
        spec["initContainers"] = init
    if tolerations:
        spec["tolerations"] = tolerations
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": ns, "name": name}, "spec": spec}


def guaranteed(name, **res):
    # Python keywords cannot contain '-': hugepages_1Gi stands for hugepages-1Gi.
    r = {(k.replace("_", "-") if k.startswith("hugepages_") else k): v for k, v in res.items()}
    return {"name": name, "resources": {"requests": r, "limits": r}}


pods = [
    pod("telco", "upf-0", [guaranteed("upf", cpu="8", memory="16Gi", hugepages_1Gi="4Gi", **{"intel.com/sriov_netdevice": "2"})]),
    pod("telco", "upf-1", [guaranteed("upf", cpu="8", memory="16Gi", hugepages_1Gi="4Gi", **{"intel.com/sriov_netdevice": "2"})]),
    pod("ml", "train-0", [guaranteed("trainer", cpu="32", memory="400Gi", **{"nvidia.com/gpu": "4", "mellanox.com/cx7": "2"})]),
    pod("ml", "inference-1", [guaranteed("server", cpu="4", memory="8Gi", **{"nvidia.com/gpu": "1"})],
        selector={"numaplane.io/pool": "gpu"}),
    pod("ml", "inference-2", [guaranteed("server", cpu="4", memory="8Gi", **{"nvidia.com/gpu": "2"})],
        selector={"numaplane.io/pool": "gpu"}),
    pod("web", "frontend-0", [{"name": "web", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]),
    pod("telco", "du-0", [guaranteed("du", cpu="24", memory="32Gi", hugepages_1Gi="8Gi")],
        init=[guaranteed("setup", cpu="1", memory="1Gi")]),
    pod("telco", "cu-big", [guaranteed("cu", cpu="40", memory="64Gi")]),
    pod("edge", "collector-0", [guaranteed("collector", cpu="2", memory="2Gi")],
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "edge", "effect": "NoSchedule"}],
        selector={"numaplane.io/pool": "edge"}),
    pod("web", "typo-0", [{"name": "web", "resources": {"requests": {"cpu": "two"}}}]),
]


def dump(path, objs):
    # JSON is valid YAML; one document per object keeps the files diff-friendly.
    with open(os.path.join(HERE, path), "w") as f:
        f.write("# Generated by examples/generate.py\n")
        for o in objs:
            f.write("---\n")
            f.write(json.dumps(o, indent=1) + "\n")


dump("cluster.yaml", docs)
dump("pods.yaml", pods)
