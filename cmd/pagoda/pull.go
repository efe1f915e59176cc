package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"pagoda/hub"
	"pagoda/progress"
)

func init() {
	register("pull", "download a GGUF from the Hugging Face hub (hf.co/OWNER/REPO[:QUANT]) or a URL into the model cache", runPull)
	register("list", "list the models in the cache: the name pull took (run -m and rm take it), size, path", runList)
	register("rm", "delete models from the cache, by the name list shows or hf.co/OWNER/REPO:QUANT", runRm)
}

const cacheHelp = "The cache is $PAGODA_MODELS (default: pagoda/models in the user cache folder)."

// pullModel downloads ref into the cache (or finds it there) and returns
// its path. An interrupt stops the download and keeps the partial file, so
// the next pull resumes it.
func pullModel(ref string, quiet bool) (string, error) {
	r, cache, err := cachedRef(ref)
	if err != nil {
		return "", err
	}
	return pull(r, cache, quiet)
}

// cachedRef parses a model reference and opens the cache it goes to.
func cachedRef(ref string) (hub.Ref, hub.Cache, error) {
	r, err := hub.ParseRef(ref)
	if err != nil {
		return hub.Ref{}, hub.Cache{}, err
	}
	cache, err := hub.DefaultCache()
	return r, cache, err
}

func pull(r hub.Ref, cache hub.Cache, quiet bool) (string, error) {
	c := hub.NewClient()
	if !quiet {
		tty := stderrIsTerminal()
		c.Progress = func(name string) hub.Progress { return hub.NewBar(os.Stderr, tty, name) }
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.Pull(ctx, cache, r)
}

func runPull(args []string) error {
	fs := flag.NewFlagSet("pull", flag.ContinueOnError)
	quiet := fs.Bool("q", false, "no progress output")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of pull: pagoda pull [-q] hf.co/OWNER/REPO[:QUANT] | URL ...\n%s\nHF_ENDPOINT sets the hub (default https://huggingface.co); HF_TOKEN is sent to it for gated repositories.\n", cacheHelp)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("name a model: pagoda pull hf.co/OWNER/REPO[:QUANT] or an https URL")
	}
	for _, ref := range fs.Args() {
		path, err := pullModel(ref, *quiet)
		if err != nil {
			return err
		}
		fmt.Println(path)
	}
	return nil
}

func runList(args []string) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of list: pagoda list\n%s\n", cacheHelp)
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("list takes no arguments")
	}
	cache, err := hub.DefaultCache()
	if err != nil {
		return err
	}
	entries, err := cache.List()
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		fmt.Fprintf(os.Stderr, "no models in %s (pagoda pull hf.co/OWNER/REPO adds one)\n", cache.Dir)
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tPATH")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Name, progress.Bytes(e.Size), e.Path)
	}
	return tw.Flush()
}

func runRm(args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of rm: pagoda rm NAME|hf.co/OWNER/REPO:QUANT ...\n%s\n", cacheHelp)
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("name a model to remove (see pagoda list)")
	}
	cache, err := hub.DefaultCache()
	if err != nil {
		return err
	}
	for _, name := range fs.Args() {
		p, err := cache.Remove(name)
		if err != nil {
			return err
		}
		fmt.Printf("removed %s\n", p)
	}
	return nil
}
