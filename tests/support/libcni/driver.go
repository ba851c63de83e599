// Command driver is the libcni test's CNI client: a small program over libcni (Debian's
// golang-github-appc-cni-dev, built in GOPATH mode) that runs AddNetworkList,
// CheckNetworkList or DelNetworkList for a conflist file, as container runtimes built on
// libcni do (containerd, CRI-O, podman's CNI backend).
//
// It reads one JSON request on stdin and prints one JSON answer on stdout:
//
//	{"op": "add"|"check"|"del", "conflist": PATH, "pluginDirs": [DIR...], "cacheDir": DIR,
//	 "containerId": ID, "netns": PATH, "ifName": NAME, "args": [[K, V]...],
//	 "capabilityArgs": {...}}
//	→ {"ok": true, "result": {...}} (add: the result in the conflist's version)
//	→ {"ok": false, "error": "..."} and exit status 1
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

type request struct {
	Op             string                 `json:"op"`
	Conflist       string                 `json:"conflist"`
	PluginDirs     []string               `json:"pluginDirs"`
	CacheDir       string                 `json:"cacheDir"`
	ContainerID    string                 `json:"containerId"`
	Netns          string                 `json:"netns"`
	IfName         string                 `json:"ifName"`
	Args           [][2]string            `json:"args"`
	CapabilityArgs map[string]interface{} `json:"capabilityArgs"`
}

type answer struct {
	OK     bool         `json:"ok"`
	Result types.Result `json:"result,omitempty"`
	Error  string       `json:"error,omitempty"`
}

func finish(a answer) {
	out, err := json.Marshal(a)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot encode the answer: %v\n", err)
		os.Exit(2)
	}
	fmt.Println(string(out))
	if !a.OK {
		os.Exit(1)
	}
	os.Exit(0)
}

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		finish(answer{Error: fmt.Sprintf("bad request: %v", err)})
	}
	list, err := libcni.ConfListFromFile(req.Conflist)
	if err != nil {
		finish(answer{Error: fmt.Sprintf("cannot load %s: %v", req.Conflist, err)})
	}
	cni := libcni.NewCNIConfigWithCacheDir(req.PluginDirs, req.CacheDir, nil)
	rt := &libcni.RuntimeConf{
		ContainerID:    req.ContainerID,
		NetNS:          req.Netns,
		IfName:         req.IfName,
		Args:           req.Args,
		CapabilityArgs: req.CapabilityArgs,
	}
	ctx := context.Background()
	switch req.Op {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			finish(answer{Error: err.Error()})
		}
		finish(answer{OK: true, Result: res})
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			finish(answer{Error: err.Error()})
		}
		finish(answer{OK: true})
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			finish(answer{Error: err.Error()})
		}
		finish(answer{OK: true})
	default:
		finish(answer{Error: fmt.Sprintf("unknown op %q", req.Op)})
	}
}
