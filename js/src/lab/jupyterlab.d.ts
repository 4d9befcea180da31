// The part of JupyterLab's API the extension (index.ts) uses, declared here: JupyterLab
// provides these packages at run time (webpack's module federation shares them, see
// @jupyterlab/builder), so they are not installed to build it (they would bring most of
// JupyterLab). Signatures as in JupyterLab 4's own declarations; the renderer interfaces
// (@jupyterlab/rendermime-interfaces) and Lumino are installed, with their own.
declare module "@jupyterlab/rendermime" {
  import type { IRenderMime } from "@jupyterlab/rendermime-interfaces";
  import type { Token } from "@lumino/coreutils";

  export interface IRenderMimeRegistry {
    readonly mimeTypes: readonly string[];
    readonly sanitizer: IRenderMime.ISanitizer;
    addFactory(factory: IRenderMime.IRendererFactory, rank?: number): void;
    createRenderer(mimeType: string): IRenderMime.IRenderer;
  }
  export const IRenderMimeRegistry: Token<IRenderMimeRegistry>;
}

declare module "@jupyterlab/notebook" {
  import type { IRenderMimeRegistry } from "@jupyterlab/rendermime";
  import type { Token } from "@lumino/coreutils";
  import type { Widget } from "@lumino/widgets";

  export interface NotebookPanel extends Widget {
    readonly content: Widget & { readonly rendermime: IRenderMimeRegistry };
    readonly sessionContext: {
      readonly isReady: boolean;
      readonly ready: Promise<void>;
      readonly session: { readonly kernel: { readonly id: string } | null } | null;
    };
  }
  export interface INotebookTracker {
    find(fn: (panel: NotebookPanel) => boolean): NotebookPanel | undefined;
  }
  export const INotebookTracker: Token<INotebookTracker>;
}

declare module "@jupyterlab/docregistry" {
  import type { IRenderMimeRegistry } from "@jupyterlab/rendermime";
  import type { IRenderMime } from "@jupyterlab/rendermime-interfaces";

  export namespace DocumentRegistry {
    interface IFileType {
      readonly name: string;
      readonly displayName?: string;
      readonly extensions: readonly string[];
      readonly mimeTypes: readonly string[];
      readonly contentType?: string;
      readonly fileFormat?: string | null;
      readonly iconClass?: string;
    }
    interface IWidgetFactory {
      readonly name: string;
    }
  }
  export interface DocumentRegistry {
    addFileType(fileType: Partial<DocumentRegistry.IFileType>): { dispose(): void };
    getFileType(name: string): DocumentRegistry.IFileType | undefined;
    addWidgetFactory(factory: DocumentRegistry.IWidgetFactory): { dispose(): void };
  }
  export class MimeDocumentFactory implements DocumentRegistry.IWidgetFactory {
    constructor(options: {
      name: string;
      label?: string;
      fileTypes: string[];
      defaultFor?: string[];
      modelName?: string;
      rendermime: IRenderMimeRegistry;
      /** The renderer of the file's content (else the registry's for its mimetype). */
      factory?: IRenderMime.IRendererFactory;
      primaryFileType?: DocumentRegistry.IFileType;
      dataType?: "json" | "string";
      renderTimeout?: number;
    });
    readonly name: string;
  }
}

declare module "@jupyterlab/application" {
  import type { DocumentRegistry } from "@jupyterlab/docregistry";
  import type { Token } from "@lumino/coreutils";

  export interface JupyterFrontEnd {
    readonly docRegistry: DocumentRegistry;
  }
  export interface JupyterFrontEndPlugin<T = void> {
    id: string;
    description?: string;
    autoStart?: boolean;
    requires?: Token<unknown>[];
    optional?: Token<unknown>[];
    // biome-ignore lint/suspicious/noExplicitAny: the services a plugin requires, in order
    activate(app: JupyterFrontEnd, ...args: any[]): T;
  }
}
