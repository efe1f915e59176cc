package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Client talks to a hub: the Hugging Face hub, or anything answering its
// API and file routes (a mirror, or a test's fake).
type Client struct {
	Endpoint string // base URL, e.g. https://huggingface.co
	Token    string // sent as a bearer token to the Endpoint's host only
	// HTTP does the requests; nil means one with the Client's transport.
	HTTP *http.Client
	// Progress, if set, is told how each download goes.
	Progress func(name string) Progress
}

// NewClient reads HF_ENDPOINT and HF_TOKEN as the huggingface tools do.
func NewClient() *Client {
	ep := os.Getenv("HF_ENDPOINT")
	if ep == "" {
		ep = "https://huggingface.co"
	}
	return &Client{Endpoint: strings.TrimRight(ep, "/"), Token: os.Getenv("HF_TOKEN")}
}

// authTransport adds the token to requests for the hub's own host. The
// hub redirects file downloads to a CDN on another host, which must not
// see the user's token.
type authTransport struct {
	host, token string
	base        http.RoundTripper
}

func (t authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.token != "" && req.URL.Host == t.host {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(req)
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	u, _ := url.Parse(c.Endpoint)
	host := ""
	if u != nil {
		host = u.Host
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	// Only the wait for headers is bounded: a whole download may take hours.
	base.ResponseHeaderTimeout = time.Minute
	c.HTTP = &http.Client{Transport: authTransport{host, c.Token, base}}
	return c.HTTP
}

// get sends a GET and returns the response when it is 2xx, or an error
// that carries the server's own words (the hub explains 401 and 404s).
func (c *Client) get(ctx context.Context, u string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", "pagoda")
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	err = fmt.Errorf("GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(msg)))
	if (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) && c.Token == "" {
		err = fmt.Errorf("%w (a gated or private repository needs HF_TOKEN)", err)
	}
	return nil, &statusError{resp.StatusCode, err}
}

type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// treeEntry is one element of the hub's tree listing. For LFS files (all
// GGUFs) oid is the git blob hash and lfs.oid the content's sha256.
type treeEntry struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// Files lists a repository's files with their sizes and sha256 sums.
func (c *Client) Files(ctx context.Context, owner, repo string) ([]File, error) {
	u := c.Endpoint + "/api/models/" + url.PathEscape(owner) + "/" + url.PathEscape(repo) + "/tree/main?recursive=true"
	resp, err := c.get(ctx, u, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var tree []treeEntry
	// The listing of a large repository is a few hundred KB; more is not a listing.
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&tree); err != nil {
		return nil, fmt.Errorf("reading the file list of %s/%s: %w", owner, repo, err)
	}
	var files []File
	for _, e := range tree {
		if e.Type != "file" {
			continue
		}
		f := File{Path: e.Path, Size: e.Size}
		if e.LFS != nil {
			f.SHA256, f.Size = strings.ToLower(e.LFS.OID), e.LFS.Size
		}
		files = append(files, f)
	}
	return files, nil
}

// fileURL is the hub's download route for one file.
func (c *Client) fileURL(r Ref, f File) string {
	parts := strings.Split(f.Path, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return c.Endpoint + "/" + url.PathEscape(r.Owner) + "/" + url.PathEscape(r.Repo) + "/resolve/main/" + strings.Join(parts, "/")
}

// Pull makes ref's file present in the cache and returns its path. A hub
// file already cached at the size the hub reports is not downloaded again.
func (c *Client) Pull(ctx context.Context, cache Cache, ref Ref) (string, error) {
	if ref.URL != nil {
		dest, err := cache.destFor(ref, File{})
		if err != nil {
			return "", err
		}
		if st, err := os.Stat(dest); err == nil && st.Mode().IsRegular() {
			return dest, nil
		}
		return done(dest, c.Download(ctx, ref.URL.String(), dest, File{Path: ref.URL.Path, Size: -1}))
	}
	files, err := c.Files(ctx, ref.Owner, ref.Repo)
	if err != nil {
		return "", err
	}
	f, err := Pick(files, ref.Quant)
	if err != nil {
		return "", fmt.Errorf("%s: %w", ref, err)
	}
	dest, err := cache.destFor(ref, f)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(dest); err == nil && st.Size() == f.Size {
		return dest, nil
	}
	return done(dest, c.Download(ctx, c.fileURL(ref, f), dest, f))
}

// done is path when err is nil: a failed pull has no file to name.
func done(path string, err error) (string, error) {
	if err != nil {
		return "", err
	}
	return path, nil
}
